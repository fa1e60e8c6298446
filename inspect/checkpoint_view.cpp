#include "inspect/checkpoint_view.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "stage/value_meta.h"

namespace pipeforge::inspect {
namespace {

namespace fs = std::filesystem;

struct CheckpointView {
  std::string dir;
  train::CheckpointMeta meta;
  std::vector<train::StageIndex> stages;  // empty for format 1 (no index)
  std::vector<int> shown;                 // the stage indices to list
};

CheckpointView loadView(const std::string& path, std::optional<int> stage) {
  CheckpointView view;
  view.dir = train::resolveCheckpoint(path);
  view.meta = train::readCheckpointMeta(view.dir);
  if (stage && (*stage < 0 || *stage >= view.meta.num_stages)) {
    throw train::CheckpointError(fmt::format("--stage {}: checkpoint '{}' has {} stages (0..{})", *stage, view.dir,
                                             view.meta.num_stages, view.meta.num_stages - 1));
  }
  for (int s = 0; s < view.meta.num_stages; ++s) {
    if (!stage || *stage == s) view.shown.push_back(s);
  }
  if (view.meta.format_version >= 2) {
    for (int s = 0; s < view.meta.num_stages; ++s) view.stages.push_back(train::readStageIndex(view.dir, s));
  }
  return view;
}

std::int64_t elements(const std::string& desc) {
  auto meta = stage::parseValueMeta(desc);
  if (!meta) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : meta->shape) n *= d;
  return n;
}

std::string joined(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string withCommas(std::int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

bool isCheckpointPath(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) &&
         (fs::exists(fs::path(path) / "meta.json", ec) || fs::exists(fs::path(path) / "latest", ec)) &&
         !fs::exists(fs::path(path) / "pipe.json", ec);
}

std::string checkpointText(const std::string& path, std::optional<int> stage) {
  const CheckpointView v = loadView(path, stage);
  const train::CheckpointMeta& m = v.meta;
  std::string out = fmt::format("checkpoint {} (format {})\n", v.dir, m.format_version);
  out += fmt::format("  step {} (data position: {} batches)\n", m.step, m.step);
  out += fmt::format("  model: {}\n", m.source);
  if (m.layout) {
    out += fmt::format("  layout: {} stages, {} pipeline ranks x {} data-parallel (world {}), {} stage{} per rank\n",
                       m.num_stages, m.layout->pipeline_ranks, m.layout->data_parallel, m.world_size,
                       m.layout->stages_per_rank, m.layout->stages_per_rank == 1 ? "" : "s");
    if (m.layout->zero_stage > 0) {
      // Note [Sharded checkpoints]
      out += fmt::format("  sharding: ZeRO stage {}: each stage's optimizer state{} in {} pieces, "
                         "stage_<i>.optim_shard_<k>.pt for data-parallel rank k\n",
                         m.layout->zero_stage, m.layout->zero_stage >= 3 ? " and parameters" : "",
                         m.layout->data_parallel);
    }
  } else {
    out += fmt::format("  layout: {} stages, world {}\n", m.num_stages, m.world_size);
  }
  out += fmt::format("  schedule: {}; seed {}\n", m.schedule, m.seed);
  if (m.block_size) out += fmt::format("  block size: {}\n", *m.block_size);
  if (m.loss_scale) {
    out += fmt::format("  fp16 loss scale: {} (growth tracker {})\n", m.loss_scale->scale, m.loss_scale->growth_tracker);
  }
  for (const auto& group : m.tied) out += "  tied: " + joined(group, " = ") + "\n";
  if (v.stages.empty()) {
    out += "  (format 1: no stage index; the tensors are listed by torch.load of each stage_<i>.pt)\n";
    return out;
  }
  std::set<std::string> optimizers;
  for (const auto& s : v.stages) {
    if (!s.optimizer_state.empty()) optimizers.insert(s.optimizer);
  }
  out += "  optimizer: " + (optimizers.empty() ? std::string("no state yet") : joined({optimizers.begin(), optimizers.end()}, ", ")) + "\n";
  for (int s : v.shown) {
    const train::StageIndex& index = v.stages[s];
    std::int64_t n = 0;
    for (const auto& [name, desc] : index.parameters) n += elements(desc);
    out += fmt::format("stage {}: {} parameters ({} elements{}), {} buffers, optimizer state for {}{}\n", s,
                       index.parameters.size(), withCommas(n),
                       index.parameter_shards > 0 ? fmt::format(", in {} shards", index.parameter_shards) : "",
                       index.buffers.size(), index.optimizer_state.size(),
                       index.optimizer_shards > 0 ? fmt::format(" in {} shards", index.optimizer_shards) : "");
    for (const auto& [name, desc] : index.parameters) {
      auto it = index.optimizer_state.find(name);
      out += fmt::format("  parameter {}  {}{}\n", name, desc,
                         it == index.optimizer_state.end() ? "" : "  [" + joined(it->second, ", ") + "]");
    }
    for (const auto& [name, desc] : index.buffers) out += fmt::format("  buffer    {}  {}\n", name, desc);
  }
  return out;
}

std::string checkpointJson(const std::string& path, std::optional<int> stage) {
  const CheckpointView v = loadView(path, stage);
  // meta.json as written (step, layout, source, schedule, seed, tied, loss
  // scale, ...), with its per-file entries replaced by the stages' indexes.
  nlohmann::json j;
  try {
    std::ifstream in(fs::path(v.dir) / "meta.json");
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw train::CheckpointError(fmt::format("'{}/meta.json' is malformed: {}", v.dir, e.what()));
  }
  j.erase("files");
  j["checkpoint"] = v.dir;
  j["format"] = v.meta.format_version;
  j["data_position"] = v.meta.step;
  j["stages"] = nlohmann::json::array();
  for (int s : v.shown) {
    nlohmann::json st = {{"index", s}};
    if (!v.stages.empty()) {
      const train::StageIndex& index = v.stages[s];
      st["parameters"] = index.parameters;
      st["buffers"] = index.buffers;
      st["optimizer"] = {{"name", index.optimizer}, {"state", index.optimizer_state}};
      if (index.optimizer_shards > 0) st["optimizer"]["shards"] = index.optimizer_shards;
      if (index.parameter_shards > 0) st["parameter_shards"] = index.parameter_shards;
    }
    j["stages"].push_back(st);
  }
  return j.dump(2) + "\n";
}

}  // namespace pipeforge::inspect
