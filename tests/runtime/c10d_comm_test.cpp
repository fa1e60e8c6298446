// The c10d communicator over Gloo, two ranks as threads of this process on
// loopback: point-to-point and all-reduce values, a failure published by one
// rank waking the other's receive with its report (Note [Failure broadcast]),
// and a rendezvous that never completes ending in a timeout, not a hang.
#include "runtime/c10d_comm.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/script.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm.h"

namespace pipeforge::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// A port free on loopback now (the kernel picks it).
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

C10dCommOptions optionsFor(int rank, int world, int port, const std::string& run, std::chrono::milliseconds timeout) {
  C10dCommOptions o;
  o.env.rank = rank;
  o.env.world_size = world;
  o.env.local_rank = rank;
  o.env.master_addr = "127.0.0.1";
  o.env.master_port = port;
  o.env.run_id = run;
  o.timeout = timeout;
  return o;
}

// Runs body(comm) for each of `world` ranks on its own thread.
template <class Body>
void onRanks(int world, const std::string& run, Body body) {
  const int port = freePort();
  std::vector<std::thread> threads;
  std::vector<std::string> errors(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<Communicator> comm = connectC10d(optionsFor(r, world, port, run, std::chrono::seconds(30)));
        body(r, *comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(C10dComm, SendRecvAndAllReduceCarryTheValues) {
  onRanks(2, "values", [](int rank, Communicator& comm) {
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.worldSize(), 2);
    at::Tensor sent = torch::arange(6, at::kFloat).reshape({2, 3}) * 1.5;
    if (rank == 0) {
      comm.isend(sent, 1, 7)->wait();
    } else {
      at::Tensor got = torch::zeros({2, 3});
      comm.irecv(got, 0, 7)->wait();
      EXPECT_TRUE(torch::equal(got, sent));
    }
    at::Tensor v = torch::full({4}, static_cast<double>(rank + 1), at::kDouble);
    comm.allreduceSum(v, {0, 1});
    EXPECT_TRUE(torch::equal(v, torch::full({4}, 3.0, at::kDouble)));
    comm.barrier();
    EXPECT_FALSE(comm.abortReport().has_value());
  });
}

TEST(C10dComm, AFailurePublishedByOneRankWakesTheOthersWaitWithItsReport) {
  onRanks(2, "abort", [](int rank, Communicator& comm) {
    if (rank == 1) {
      comm.barrier();
      comm.abort("rank 1 at step 3: out of cheese");
      return;
    }
    at::Tensor never = torch::zeros({3});
    std::unique_ptr<PendingOp> recv = comm.irecv(never, 1, 9);
    comm.barrier();
    const auto t0 = Clock::now();
    try {
      recv->wait();
      ADD_FAILURE() << "a receive from a failed rank returned";
    } catch (const CommError& e) {
      EXPECT_EQ(e.kind(), CommError::Kind::kAborted) << e.what();
      EXPECT_NE(e.report().find("out of cheese"), std::string::npos) << e.report();
    }
    // Woken by the store's report within a few polls, not by the 30 s timeout.
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
    ASSERT_TRUE(comm.abortReport().has_value());
    EXPECT_NE(comm.abortReport()->find("out of cheese"), std::string::npos);
  });
}

TEST(C10dComm, ARendezvousThatNeverCompletesTimesOut) {
  const int port = freePort();
  const auto t0 = Clock::now();
  try {
    connectC10d(optionsFor(0, 2, port, "lonely", std::chrono::milliseconds(1500)));
    FAIL() << "rank 0 connected without rank 1";
  } catch (const CommError& e) {
    // Hosting the store or joining the group gives up; either way the
    // message says what every rank must share.
    EXPECT_NE(e.kind(), CommError::Kind::kAborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("MASTER_ADDR/MASTER_PORT"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30.0);
}

}  // namespace
}  // namespace pipeforge::runtime
