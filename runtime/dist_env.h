// Who this process is in a distributed job: rank, world size, local rank and
// where the rendezvous store lives.
//
// The ONE place that reads the environment (Note [Environment]). Explicit
// options win; then torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT); then SLURM's (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_LAUNCH_NODE_IPADDR or the first host of
// SLURM_NODELIST); then a single process (rank 0 of 1). The run id and the
// private folder come from the variables named at DistEnv::run_id.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace pipeforge::runtime {

class DistEnvError : public pipeforge::Error {
 public:
  explicit DistEnvError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
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
  // Note [Run namespace]: every key the job writes to its store lives under
  // "pipeforge/run/<run_id>/". PIPEFORGE_RUN_ID (set by our launcher), else
  // TORCHELASTIC_RUN_ID (torchrun), else SLURM_JOB_ID[.SLURM_STEP_ID], else "none".
  std::string run_id = "none";
  // PIPEFORGE_STORE_DIR: a folder private to this job on this host, made by
  // our local launcher (Note [Store exposure]); empty otherwise.
  std::string private_dir;
  // torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 connects to it as a client.
  bool agent_store = false;
  // GLOO_SOCKET_IFNAME, split at commas (PyTorch's meaning): the interfaces
  // Gloo binds to; empty: the one that reaches MASTER_ADDR (Note [Which
  // address Gloo binds] in runtime/gloo_address.h).
  std::vector<std::string> gloo_interfaces;

  // The prefix of this run's keys in the store.
  std::string storePrefix() const { return "pipeforge/run/" + run_id; }
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool isLoopbackAddress(const std::string& addr);

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
