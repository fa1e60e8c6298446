#include "runtime/dist_env.h"

#include <algorithm>

#include <cctype>
#include <cstdlib>
#include <string_view>

namespace pipeforge::runtime {
namespace {

// Note [Environment]: the only getenv in the runtime. Everything else receives
// a DistEnv, so tests can describe any launcher without touching the process.
std::optional<std::string> getProcessEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int parseInt(const std::string& name, const std::string& text) {
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw DistEnvError(name + "='" + text + "' is not an integer; set it to a whole number or unset it");
  }
  return static_cast<int>(value);
}

std::optional<int> intVar(const EnvLookup& env, const std::string& name) {
  auto text = env(name);
  if (!text) return std::nullopt;
  return parseInt(name, *text);
}

struct Candidate {
  std::string source;
  std::optional<int> rank, world_size, local_rank, port;
  std::optional<std::string> addr;
};

Candidate fromTorchrun(const EnvLookup& env) {
  Candidate c{"torchrun"};
  c.rank = intVar(env, "RANK");
  c.world_size = intVar(env, "WORLD_SIZE");
  c.local_rank = intVar(env, "LOCAL_RANK");
  c.addr = env("MASTER_ADDR");
  c.port = intVar(env, "MASTER_PORT");
  return c;
}

Candidate fromSlurm(const EnvLookup& env) {
  Candidate c{"slurm"};
  c.rank = intVar(env, "SLURM_PROCID");
  c.world_size = intVar(env, "SLURM_NTASKS");
  c.local_rank = intVar(env, "SLURM_LOCALID");
  c.addr = env("SLURM_LAUNCH_NODE_IPADDR");
  if (!c.addr) {
    if (auto list = env("SLURM_JOB_NODELIST")) c.addr = firstSlurmHost(*list);
    else if (auto list2 = env("SLURM_NODELIST")) c.addr = firstSlurmHost(*list2);
  }
  // SLURM has no port: MASTER_PORT if given (as torchrun setups export), else the default.
  c.port = intVar(env, "MASTER_PORT");
  return c;
}

// Run ids become store keys and appear in logs: keep them to a safe alphabet.
std::string checkedRunId(const std::string& name, const std::string& id) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char ch : id) ok = ok && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.');
  if (!ok) {
    throw DistEnvError(name + "='" + id + "' is not a usable run id; use 1 to 128 letters, digits, '-', '_' or '.'");
  }
  return id;
}

std::string runIdFrom(const EnvLookup& env) {
  for (const char* name : {"PIPEFORGE_RUN_ID", "TORCHELASTIC_RUN_ID"}) {
    if (auto id = env(name)) return checkedRunId(name, *id);
  }
  if (auto job = env("SLURM_JOB_ID")) {
    std::string id = *job;
    if (auto step = env("SLURM_STEP_ID")) id += "." + *step;
    return checkedRunId("SLURM_JOB_ID", id);
  }
  return "none";
}

}  // namespace

bool isLoopbackAddress(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

EnvLookup processEnv() { return &getProcessEnv; }

std::string firstSlurmHost(const std::string& nodelist) {
  // "node[03-05,07],gpu1": the first entry, with its bracket's first number.
  std::string_view list(nodelist);
  std::size_t depth = 0, end = list.size();
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') ++depth;
    if (list[i] == ']' && depth > 0) --depth;
    if (list[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string_view first = list.substr(0, end);
  std::size_t open = first.find('[');
  if (open == std::string_view::npos) return std::string(first);
  std::string_view inside = first.substr(open + 1);
  std::size_t stop = inside.find_first_of("-,]");
  return std::string(first.substr(0, open)) + std::string(inside.substr(0, stop));
}

DistEnv resolveDistEnv(const DistOptions& options, const EnvLookup& env) {
  Candidate chosen{"default"};
  Candidate torchrun = fromTorchrun(env);
  Candidate slurm = fromSlurm(env);
  if (torchrun.rank || torchrun.world_size) chosen = torchrun;
  else if (slurm.rank || slurm.world_size) chosen = slurm;

  DistEnv out;
  out.source = chosen.source;
  if (options.rank || options.world_size) out.source = "options";
  out.rank = options.rank.value_or(chosen.rank.value_or(0));
  out.world_size = options.world_size.value_or(chosen.world_size.value_or(1));
  out.local_rank = options.local_rank.value_or(chosen.local_rank.value_or(out.rank));
  out.master_addr = options.master_addr.value_or(chosen.addr.value_or("127.0.0.1"));
  out.master_port = options.master_port.value_or(chosen.port.value_or(DistEnv::kDefaultPort));
  out.run_id = runIdFrom(env);
  out.private_dir = env("PIPEFORGE_STORE_DIR").value_or("");
  out.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  const std::string ifnames = env("GLOO_SOCKET_IFNAME").value_or("");
  for (std::size_t start = 0; start < ifnames.size();) {
    const std::size_t comma = std::min(ifnames.find(',', start), ifnames.size());
    if (comma > start) out.gloo_interfaces.push_back(ifnames.substr(start, comma - start));
    start = comma + 1;
  }

  if (out.world_size < 1) {
    throw DistEnvError("world size " + std::to_string(out.world_size) + " (from " + out.source +
                       ") must be at least 1");
  }
  if (out.rank < 0 || out.rank >= out.world_size) {
    throw DistEnvError("rank " + std::to_string(out.rank) + " (from " + out.source + ") is outside the world of " +
                       std::to_string(out.world_size) + " ranks (0.." + std::to_string(out.world_size - 1) + ")");
  }
  if (out.master_port < 1 || out.master_port > 65535) {
    throw DistEnvError("master port " + std::to_string(out.master_port) + " (from " + out.source +
                       ") is outside 1..65535");
  }
  if (out.master_addr.empty()) throw DistEnvError("master address (from " + out.source + ") is empty");
  return out;
}

}  // namespace pipeforge::runtime
