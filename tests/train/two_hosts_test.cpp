// A real two-host run on one machine: each rank in its own network
// namespace, joined by a veth pair (192.0.2.1 and 192.0.2.2, TEST-NET-1,
// which never leaves the namespaces), started as torchrun would start it:
// RANK / WORLD_SIZE / MASTER_ADDR in the environment, no --nproc.
//
// Gloo binds to the address the host name resolves to, so each rank also
// gets its own host name (unshare --uts) and /etc/netns/<ns>/hosts, which
// `ip netns exec` mounts over /etc/hosts. Skipped without root / CAP_NET_ADMIN.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config/train_config.h"
#include "tests/support/build_paths.h"
#include "tests/support/zoo.h"
#include "tests/train/train_fixture.h"

namespace pipeforge::testing {
namespace {

namespace fs = std::filesystem;

// Two namespaces and a veth pair, removed on destruction.
class TwoHosts {
 public:
  TwoHosts() {
    const int id = static_cast<int>(::getpid() % 100000);
    ns_ = {fmt::format("pfa{}", id), fmt::format("pfb{}", id)};
    const std::string veth_a = fmt::format("pfva{}", id), veth_b = fmt::format("pfvb{}", id);
    if (::geteuid() != 0) {
      reason_ = "not root: creating network namespaces needs CAP_NET_ADMIN";
      return;
    }
    if (runCommand("ip netns add " + ns_[0]).exit_code != 0) {
      reason_ = "`ip netns add` is not allowed here (no CAP_NET_ADMIN, or no ip tool)";
      return;
    }
    created_ = true;
    made_etc_netns_ = !fs::exists("/etc/netns");
    const std::vector<std::string> steps = {
        "ip netns add " + ns_[1],
        fmt::format("ip link add {} type veth peer name {}", veth_a, veth_b),
        fmt::format("ip link set {} netns {}", veth_a, ns_[0]),
        fmt::format("ip link set {} netns {}", veth_b, ns_[1]),
        fmt::format("ip -n {} addr add {}/24 dev {}", ns_[0], kAddr[0], veth_a),
        fmt::format("ip -n {} addr add {}/24 dev {}", ns_[1], kAddr[1], veth_b),
        fmt::format("ip -n {} link set {} up", ns_[0], veth_a),
        fmt::format("ip -n {} link set {} up", ns_[1], veth_b),
        fmt::format("ip -n {} link set lo up", ns_[0]),
        fmt::format("ip -n {} link set lo up", ns_[1]),
    };
    for (const auto& step : steps) {
      auto r = runCommand(step);
      if (r.exit_code != 0) {
        reason_ = fmt::format("'{}' failed: {}", step, r.output);
        return;
      }
    }
    for (int h = 0; h < 2; ++h) {
      fs::create_directories("/etc/netns/" + ns_[h]);
      std::ofstream("/etc/netns/" + ns_[h] + "/hosts")
          << fmt::format("127.0.0.1 localhost\n{} {}\n{} {}\n", kAddr[0], hostName(0), kAddr[1], hostName(1));
    }
    ready_ = true;
  }

  ~TwoHosts() {
    if (!created_) return;
    for (const auto& ns : ns_) {
      runCommand("ip netns del " + ns);  // takes its end of the veth pair along
      std::error_code ec;
      fs::remove_all("/etc/netns/" + ns, ec);
    }
    std::error_code ec;
    if (made_etc_netns_) fs::remove("/etc/netns", ec);  // only if empty
  }

  bool ready() const { return ready_; }
  const std::string& reason() const { return reason_; }
  std::string hostName(int h) const { return fmt::format("{}-host", ns_[h]); }

  // The command line that runs `command` as host h.
  std::string onHost(int h, const std::string& command) const {
    return fmt::format("ip netns exec {} unshare --uts sh -c 'hostname {} && exec {}'", ns_[h], hostName(h), command);
  }

  static constexpr const char* kAddr[2] = {"192.0.2.1", "192.0.2.2"};

 private:
  std::vector<std::string> ns_;
  std::string reason_;
  bool created_ = false;
  bool ready_ = false;
  bool made_etc_netns_ = false;
};

TEST(TwoHosts, TorchrunStyleRanksTrainOverAVethPair) {
  TwoHosts hosts;
  if (!hosts.ready()) GTEST_SKIP() << hosts.reason();
  TrainWorkspace ws;
  RunSpec s;
  s.split = "num_stages: 2\n  policy: parameters";
  s.optimizer = "{name: sgd, lr: 0.05, momentum: 0.9}";
  s.timeout_s = 30;
  const std::string config = ws.writeConfig("hosts", s);

  CommandResult results[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      const std::string env = fmt::format("env RANK={} WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR={} MASTER_PORT=29617", r,
                                          TwoHosts::kAddr[0]);
      results[r] = runCommand(hosts.onHost(r, fmt::format("{} {} train --config {}", env, PIPEFORGE_BINARY, config)));
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
  EXPECT_NE(results[0].output.find("2 ranks = 2 pipeline x 1 data-parallel"), std::string::npos) << results[0].output;

  // Each rank split the model itself (no launcher), into its own folder.
  EXPECT_TRUE(fs::exists(ws.outDir("hosts") + "/stages.rank0/pipe.json"));
  EXPECT_TRUE(fs::exists(ws.outDir("hosts") + "/stages.rank1/pipe.json"));
  auto trained = exportedParameters(ws.checkpointDir("hosts"), zooModelPath("gpt"), ws.dir() + "/trained.pt");
  auto bad = mismatches(trained, trainReference(train::loadTrainConfig(config)), 1e-5, 4e-5);
  EXPECT_TRUE(bad.empty()) << fmt::format("{}", fmt::join(bad, "\n"));
}

}  // namespace
}  // namespace pipeforge::testing
