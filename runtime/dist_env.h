// Who this process is in a distributed job: rank, world size, local rank and
// where the rendezvous store lives.
//
// The ONE place that reads the environment (Note [Environment]). Explicit
// options win; then torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT); then SLURM's (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_LAUNCH_NODE_IPADDR or the first host of
// SLURM_NODELIST); then a single process (rank 0 of 1).
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace pipeforge::runtime {

class DistEnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Explicit settings; each unset field falls back to the environment.
struct DistOptions {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> master_addr;  // default 127.0.0.1
  std::optional<int> master_port;          // default 29500
};

struct DistEnv {
  static constexpr int kDefaultPort = 29500;

  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultPort;
  std::string source = "default";  // "options", "torchrun", "slurm" or "default"
};

// Reads a variable; returns nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv).
EnvLookup processEnv();

// Resolves the settings above. Throws DistEnvError naming the variable and
// its value when one is malformed (not an integer, rank outside the world,
// port outside 1..65535).
DistEnv resolveDistEnv(const DistOptions& options, const EnvLookup& env = processEnv());

// "<first host>" of a SLURM host list: "node[03-05,07],gpu1" -> "node03".
std::string firstSlurmHost(const std::string& nodelist);

}  // namespace pipeforge::runtime
