// Messages between ranks through the job's store (train/rank_channel.h): a
// value that never comes names who was to send it.
#include "train/rank_channel.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fmt/format.h>

#include "common/error.h"
#include "compat/c10d_store.h"

namespace pipeforge::train {
namespace {

// A port nothing listens on now (the kernel's pick for port 0).
int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

class RankChannelStore : public ::testing::Test {
 protected:
  void SetUp() override {
    env_.world_size = 2;
    env_.rank = 0;
    env_.master_addr = "127.0.0.1";
    env_.master_port = freePort();
    ASSERT_GT(env_.master_port, 0);
    env_.run_id = "rank_channel_test";
    compat::StoreEndpoint server;
    server.host = env_.master_addr;
    server.port = env_.master_port;
    server.is_server = true;
    server.world_size = 2;
    server.timeout = std::chrono::seconds(5);
    server_ = compat::openStore(server);
  }

  runtime::DistEnv env_;
  c10::intrusive_ptr<c10d::Store> server_;
};

// Issue 40's lost host: rank 0 waiting on rank 1's checkpoint folder list
// must say which rank and host stopped, not only which key is missing.
TEST_F(RankChannelStore, AValueThatNeverComesNamesTheRankAndHostThatOwedIt) {
  // 1 s: LibTorch 1.13's TCPStore client counts its connect deadline in whole seconds.
  RankChannel channel(env_, std::chrono::milliseconds(1000), [](int r) { return fmt::format("rank {} (host b)", r); });
  try {
    channel.takeFrom(1, "checkpoint/6/folder/1");
    FAIL() << "took a value nobody wrote";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailure);
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("rank 1 (host b) wrote no 'checkpoint/6/folder/1' within 1 s: it has stopped, or lost "
                         "its link to the store TCPStore at 127.0.0.1:",
                         0),
              0u)
        << what;
  }
  // A key any rank might write still names the key and the store.
  try {
    channel.take("loss/3/0");
    FAIL() << "took a value nobody wrote";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("no value for 'loss/3/0' from the other ranks within 1 s (store ", 0), 0u)
        << e.what();
  }
}

TEST_F(RankChannelStore, AValueWrittenIsTakenOnceFromItsSender) {
  RankChannel writer(env_, std::chrono::milliseconds(2000));
  RankChannel reader(env_, std::chrono::milliseconds(1000));
  writer.publish("model_state/1", "{\"bytes\": 7}");
  EXPECT_EQ(reader.takeFrom(1, "model_state/1"), "{\"bytes\": 7}");
  // Taken means deleted: a second take waits and fails, naming rank 1 without a host.
  try {
    reader.takeFrom(1, "model_state/1");
    FAIL() << "took a deleted value";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rank 1 wrote no 'model_state/1' within 1 s", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::train
