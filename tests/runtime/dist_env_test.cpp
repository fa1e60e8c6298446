#include "runtime/dist_env.h"
#include "runtime/gloo_address.h"

#include <gtest/gtest.h>

#include <map>

namespace pipeforge::runtime {
namespace {

EnvLookup fakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(DistEnvTest, DefaultsToOneProcess) {
  DistEnv env = resolveDistEnv({}, fakeEnv({}));
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, DistEnv::kDefaultPort);
  EXPECT_EQ(env.source, "default");
}

TEST(DistEnvTest, ReadsTorchrun) {
  DistEnv env = resolveDistEnv({}, fakeEnv({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "10.0.0.2"}, {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "10.0.0.2");
  EXPECT_EQ(env.master_port, 1234);
  EXPECT_EQ(env.source, "torchrun");
}

TEST(DistEnvTest, ReadsSlurmWithNodeListHost) {
  DistEnv env = resolveDistEnv({}, fakeEnv({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                            {"SLURM_NODELIST", "gpu[07-09,12],cpu1"}}));
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(env.source, "slurm");
}

TEST(DistEnvTest, SlurmLaunchNodeAddressWins) {
  DistEnv env = resolveDistEnv({}, fakeEnv({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"},
                                            {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"}, {"SLURM_NODELIST", "n1"}}));
  EXPECT_EQ(env.master_addr, "10.1.1.1");
}

TEST(DistEnvTest, TorchrunWinsOverSlurmAndOptionsWinOverBoth) {
  auto env = fakeEnv({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "9"}});
  EXPECT_EQ(resolveDistEnv({}, env).rank, 1);
  DistOptions opts;
  opts.rank = 0;
  opts.world_size = 3;
  opts.master_port = 4321;
  DistEnv d = resolveDistEnv(opts, env);
  EXPECT_EQ(d.rank, 0);
  EXPECT_EQ(d.world_size, 3);
  EXPECT_EQ(d.master_port, 4321);
  EXPECT_EQ(d.source, "options");
}

TEST(DistEnvTest, RejectsMalformedValuesNamingThem) {
  try {
    resolveDistEnv({}, fakeEnv({{"RANK", "two"}, {"WORLD_SIZE", "4"}}));
    FAIL() << "no error";
  } catch (const DistEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='two'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolveDistEnv({}, fakeEnv({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), DistEnvError);
  EXPECT_THROW(resolveDistEnv({}, fakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}})),
               DistEnvError);
}

TEST(DistEnvTest, FirstSlurmHost) {
  EXPECT_EQ(firstSlurmHost("node1"), "node1");
  EXPECT_EQ(firstSlurmHost("node[03-05,07],gpu1"), "node03");
  EXPECT_EQ(firstSlurmHost("a1,b2"), "a1");
  EXPECT_EQ(firstSlurmHost("rack[2,4]"), "rack2");
}

// Note [Which address Gloo binds]: GLOO_SOCKET_IFNAME first (split at
// commas, each checked to exist), loopback for a loopback MASTER_ADDR, else
// the route's source address; a missing interface is refused naming the
// variable, the interfaces the host has and the fix.
TEST(GlooBindingTest, ChoosesAsDocumented) {
  DistEnv env = resolveDistEnv({}, fakeEnv({{"GLOO_SOCKET_IFNAME", "lo,lo"}}));
  EXPECT_EQ(env.gloo_interfaces, (std::vector<std::string>{"lo", "lo"}));
  GlooBinding b = chooseGlooBinding(env);
  EXPECT_EQ(b.interfaces, env.gloo_interfaces);
  EXPECT_EQ(b.why, "GLOO_SOCKET_IFNAME=lo,lo");

  env = resolveDistEnv({}, fakeEnv({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}}));
  b = chooseGlooBinding(env);
  EXPECT_TRUE(b.interfaces.empty());
  EXPECT_EQ(b.address, "127.0.0.1");

  env = resolveDistEnv({}, fakeEnv({{"GLOO_SOCKET_IFNAME", "nope0"}}));
  try {
    chooseGlooBinding(env);
    ADD_FAILURE() << "no error";
  } catch (const DistEnvError& e) {
    EXPECT_NE(std::string(e.what()).find("GLOO_SOCKET_IFNAME names interface 'nope0', which this host lacks (it has "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("lo"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge::runtime
