#include "config/train_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/byte_size.h"
#include "common/english.h"
#include "common/yaml_errors.h"
#include "mesh/mesh_layout.h"
#include "common/yaml_keys.h"
#include "config/config_overrides.h"
#include "partitioner/split_spec.h"
#include "schedules/csv.h"
#include "schedules/generate.h"
#include "schedules/lower.h"
#include "schedules/simulate_unit.h"
#include "schedules/validate.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

// Reads one YAML map, dispatching each key to its handler; a key without a
// handler is an error that lists the keys the section takes.
class Section {
 public:
  // `labels`: the nodes command-line overrides wrote (Note [Config overrides]), which
  // messages place on the command line instead of in the file.
  Section(const std::string& origin, std::string prefix, const OverrideLabels* labels = nullptr)
      : origin_(origin), prefix_(std::move(prefix)), labels_(labels) {}
  // A section inside `parent`'s document.
  Section(const Section& parent, std::string prefix)
      : origin_(parent.origin_), prefix_(std::move(prefix)), labels_(parent.labels_) {}

  // The override that wrote `node`, or nullptr when the file did.
  const std::string* overrideOf(const YAML::Node& node) const {
    if (labels_ == nullptr) return nullptr;
    for (const auto& [labelled, label] : *labels_) {
      if (labelled.is(node)) return &label;
    }
    return nullptr;
  }

  std::string where(const YAML::Node& node) const {
    if (const std::string* label = overrideOf(node)) return *label;
    const auto mark = node.Mark();
    if (mark.line < 0) return origin_;
    return fmt::format("{}:{}", origin_, mark.line + 1);
  }
  std::string key(const std::string& name) const { return prefix_.empty() ? name : prefix_ + "." + name; }

  [[noreturn]] void fail(const YAML::Node& node, const std::string& name, const std::string& expected) const {
    std::string got = node.IsScalar() ? fmt::format("'{}'", node.Scalar())
                      : node.IsSequence() ? std::string("a list")
                      : node.IsMap()      ? std::string("a map")
                                          : std::string("nothing");
    throw ConfigError(fmt::format("{}: {} must be {}, got {}", where(node), key(name), expected, got));
  }

  template <typename T>
  T scalar(const YAML::Node& node, const std::string& name, const std::string& expected) const {
    if (!node.IsScalar()) fail(node, name, expected);
    try {
      return node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, name, expected);
    }
  }

  std::int64_t integer(const YAML::Node& node, const std::string& name, std::int64_t min) const {
    std::string expected = fmt::format("an integer >= {}", min);
    auto v = scalar<std::int64_t>(node, name, expected);
    if (v < min) fail(node, name, expected);
    return v;
  }

  // For keys held in an int: a larger value would wrap (microbatches: 4294967296 became 0).
  int smallInteger(const YAML::Node& node, const std::string& name, int min) const {
    std::string expected = fmt::format("an integer in [{}, {}]", min, std::numeric_limits<int>::max());
    auto v = scalar<std::int64_t>(node, name, expected);
    if (v < min || v > std::numeric_limits<int>::max()) fail(node, name, expected);
    return static_cast<int>(v);
  }

  double number(const YAML::Node& node, const std::string& name, double min, bool inclusive) const {
    std::string expected = fmt::format("a number {} {}", inclusive ? ">=" : ">", min);
    auto v = scalar<double>(node, name, expected);
    if (!std::isfinite(v) || v < min || (!inclusive && v == min)) fail(node, name, expected);
    return v;
  }

  bool boolean(const YAML::Node& node, const std::string& name) const {
    return scalar<bool>(node, name, "true or false");
  }

  std::string string(const YAML::Node& node, const std::string& name) const {
    return scalar<std::string>(node, name, "a string");
  }

  template <typename E>
  E choice(const YAML::Node& node, const std::string& name, const std::vector<std::pair<std::string, E>>& options) const {
    std::vector<std::string> names;
    for (const auto& [n, v] : options) names.push_back(n);
    std::string expected = fmt::format("one of {}", fmt::join(names, ", "));
    auto text = scalar<std::string>(node, name, expected);
    for (const auto& [n, v] : options) {
      if (n == text) return v;
    }
    fail(node, name, expected);
  }

  using Handler = std::function<void(const YAML::Node&)>;

  void read(const YAML::Node& node, const std::string& self_name, const std::map<std::string, Handler>& handlers) const {
    if (!node.IsMap()) {
      std::vector<std::string> keys;
      for (const auto& [k, h] : handlers) keys.push_back(k);
      throw ConfigError(fmt::format("{}: {} must be a map with keys {}", where(node), self_name, fmt::join(keys, ", ")));
    }
    for (const auto& kv : node) {
      // YAML allows lists and maps as keys (`? [a, b]: 1`); yaml-cpp would throw its own exception.
      if (kv.first.IsSequence() || kv.first.IsMap()) {
        throw ConfigError(fmt::format("{}: {} has a {} as a key; keys are names such as {}", where(kv.first),
                                      self_name, kv.first.IsMap() ? "map" : "list", handlers.begin()->first));
      }
      auto name = kv.first.as<std::string>();
      auto it = handlers.find(name);
      if (it == handlers.end()) {
        std::vector<std::string> keys;
        for (const auto& [k, h] : handlers) keys.push_back(k);
        throw ConfigError(fmt::format("{}: unknown key '{}'; {} takes {}", where(kv.first), key(name),
                                      self_name, fmt::join(keys, ", ")));
      }
      it->second(kv.second);
    }
  }

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::string prefix_;
  const OverrideLabels* labels_;
};

void requireFile(const std::string& origin, const std::string& key, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw ConfigError(fmt::format("{}: {}: '{}' does not exist (relative paths start at the working directory {})",
                                  origin, key, path, fs::current_path().string()));
  }
}

// "t.yaml:4: num_stages must ..." -> "t.yaml:4: model: num_stages must ...".
std::string underModel(const std::string& what, const std::string& origin) {
  if (what.rfind(origin, 0) != 0) return fmt::format("{}: model: {}", origin, what);
  std::size_t colon = what.find(": ", origin.size());
  if (colon == std::string::npos) return fmt::format("{}: model: {}", origin, what);
  return what.substr(0, colon + 2) + "model: " + what.substr(colon + 2);
}

// A copy of `node` whose nodes carry no position.
YAML::Node withoutMarks(const YAML::Node& node) {
  if (node.IsScalar()) return YAML::Node(node.Scalar());
  if (node.IsSequence()) {
    YAML::Node out(YAML::NodeType::Sequence);
    for (const auto& item : node) out.push_back(withoutMarks(item));
    return out;
  }
  if (node.IsMap()) {
    YAML::Node out(YAML::NodeType::Map);
    for (const auto& kv : node) out[withoutMarks(kv.first)] = withoutMarks(kv.second);
    return out;
  }
  return YAML::Node();
}

void parseModel(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "model");
  // The inline split keys, re-emitted as a split spec for the splitter.
  YAML::Node inline_spec(YAML::NodeType::Map);
  bool has_inline = false;
  std::vector<std::string> overridden;  // the inline keys' overrides, for messages
  auto keep = [&](const std::string& name) {
    return [&, name](const YAML::Node& v) {
      if (const std::string* label = s.overrideOf(v)) {
        // The split spec's reader places errors by line: an override has none in the file.
        inline_spec[name] = withoutMarks(v);
        overridden.push_back(*label);
      } else {
        inline_spec[name] = v;
      }
      has_inline = true;
    };
  };
  s.read(node, "model",
         {{"path", [&](const YAML::Node& v) { c.model.path = s.string(v, "path"); }},
          {"split_spec", [&](const YAML::Node& v) { c.model.split_spec = s.string(v, "split_spec"); }},
          {"split_dir", [&](const YAML::Node& v) { c.model.split_dir = s.string(v, "split_dir"); }},
          {"weights",
           [&](const YAML::Node& v) {
             const std::string expected = "a safetensors file or save_pretrained folder, or a list of them";
             c.model.weights.clear();
             if (v.IsSequence()) {
               for (const auto& item : v) c.model.weights.push_back(s.scalar<std::string>(item, "weights", expected));
               if (c.model.weights.empty()) s.fail(v, "weights", expected);
             } else {
               c.model.weights.push_back(s.scalar<std::string>(v, "weights", expected));
             }
           }},
          {"accept_unused_weights",
           [&](const YAML::Node& v) { c.model.accept_unused_weights = s.boolean(v, "accept_unused_weights"); }},
          {"split_points", keep("split_points")},
          {"num_stages", keep("num_stages")},
          {"policy", keep("policy")},
          {"example_inputs", keep("example_inputs")},
          {"constant_inputs", keep("constant_inputs")}});
  const std::string o = top.origin();
  if (c.model.split_dir.empty() == c.model.path.empty()) {
    throw ConfigError(fmt::format("{}: model needs exactly one of model.path (a TorchScript .pt to split) and "
                                  "model.split_dir (a folder written by `pipeforge split`)",
                                  s.where(node)));
  }
  if (!c.model.split_dir.empty()) {
    if (!c.model.weights.empty()) {
      throw ConfigError(fmt::format("{}: model.weights fills a model as it is split, and model.split_dir is already "
                                    "split; give model.path (the .pt2) with model.weights, or split it yourself with "
                                    "`pipeforge split MODEL.pt2 --weights SRC`",
                                    s.where(node)));
    }
    if (!c.model.split_spec.empty() || has_inline) {
      throw ConfigError(fmt::format("{}: model.split_dir is already split; drop model.split_spec and the inline "
                                    "split keys, or use model.path instead",
                                    s.where(node)));
    }
    requireFile(o, "model.split_dir", c.model.split_dir);
    requireFile(o, "model.split_dir", (fs::path(c.model.split_dir) / "pipe.json").string());
    return;
  }
  requireFile(o, "model.path", c.model.path);
  for (const std::string& w : c.model.weights) requireFile(o, "model.weights", w);
  if (!c.model.split_spec.empty() && has_inline) {
    if (!overridden.empty()) {
      // The inline key came from the command line: no line of the file to point at.
      throw ConfigError(fmt::format("{}: {} sets an inline split key, but the config splits with model.split_spec "
                                    "'{}'; give either model.split_spec or inline split keys, not both: put the key "
                                    "in '{}' instead",
                                    o, fmt::join(overridden, ", "), c.model.split_spec, c.model.split_spec));
    }
    throw ConfigError(fmt::format("{}: give either model.split_spec or inline split keys (split_points, num_stages, "
                                  "policy, example_inputs, constant_inputs), not both",
                                  s.where(node)));
  }
  if (!c.model.split_spec.empty()) {
    requireFile(o, "model.split_spec", c.model.split_spec);
    try {
      c.model.spec = partitioner::loadSplitSpec(c.model.split_spec);
    } catch (const partitioner::SpecError& e) {
      throw ConfigError(fmt::format("{}: model.split_spec: {}", o, e.what()));
    }
  }
  if (has_inline) {
    // The kept entries are the config's own nodes, so errors carry its lines:
    // "train.yaml:4: model: num_stages must be >= 1, got 0".
    try {
      c.model.spec = partitioner::parseSplitSpecNode(inline_spec, o);
    } catch (const partitioner::SpecError& e) {
      std::string message = underModel(e.what(), o);
      if (!overridden.empty()) message += fmt::format(" (set on the command line: {})", fmt::join(overridden, ", "));
      throw ConfigError(message);
    }
  }
}

// `none`, `full`, or `{every_n: k}` (runtime Note [Checkpointing every k-th call]).
void parseCheckpointing(const Section& s, const YAML::Node& node, PipelineConfig& p) {
  const std::string name = "activation_checkpointing";
  const std::string expected = "none, full or a map {every_n: k} or {microbatches: k}";
  if (node.IsMap()) {
    Section sub(s, s.key(name));
    int given = 0;
    sub.read(node, s.key(name), {{"every_n", [&](const YAML::Node& v) {
                                   p.checkpoint_every_n = sub.smallInteger(v, "every_n", 1);
                                   p.activation_checkpointing = ActivationCheckpointing::kEveryN;
                                   ++given;
                                 }},
                                 {"microbatches", [&](const YAML::Node& v) {
                                   p.checkpoint_microbatches = sub.smallInteger(v, "microbatches", 0);
                                   p.activation_checkpointing = ActivationCheckpointing::kMicrobatches;
                                   ++given;
                                 }}});
    if (given > 1) {
      throw ConfigError(fmt::format("{}: pipeline.activation_checkpointing takes every_n (which submodule calls) or "
                                    "microbatches (how many live microbatches keep their graph), not both; keep one",
                                    s.where(node)));
    }
    if (given == 1) return;
    // An empty map: nothing chosen.
    s.fail(node, name, expected);
  }
  std::string text = s.scalar<std::string>(node, name, expected);
  p.checkpoint_every_n = 0;
  if (text == "none") {
    p.activation_checkpointing = ActivationCheckpointing::kNone;
    return;
  }
  if (text == "full") {
    p.activation_checkpointing = ActivationCheckpointing::kFull;
    return;
  }
  s.fail(node, name, expected);
}

// Reads pipeline.schedule_csv's file: a PyTorch-format schedule that
// validates (PyTorch's rules) and runs to the end once lowered. What it must
// match in the job (ranks, stages) is checked by checkLayout.
schedules::Program readScheduleCsv(const std::string& where, const std::string& path) {
  schedules::Program program;
  try {
    program = schedules::loadCsvFile(path);
  } catch (const schedules::ScheduleError& e) {
    throw ConfigError(fmt::format("{}: pipeline.schedule_csv: {}", where, e.what()));
  }
  try {
    schedules::validateProgram(program);
    schedules::simulateUnit(schedules::hasSendRecv(program) ? program : schedules::lowerForExecution(program));
  } catch (const schedules::ScheduleError& e) {
    throw ConfigError(fmt::format("{}: pipeline.schedule_csv '{}' is not a schedule that can run: {}", where, path,
                                  e.what()));
  }
  return program;
}

// One chunk entry: an integer dim >= 0 or `replicate`.
ChunkEntry parseChunkEntry(const Section& s, const YAML::Node& node, const std::string& name) {
  const std::string expected = "an integer dim >= 0 (split along it) or replicate (every microbatch gets the whole "
                               "tensor)";
  ChunkEntry entry;
  entry.where = s.where(node);
  const std::string text = s.scalar<std::string>(node, name, expected);
  if (text == "replicate") {
    entry.replicate = true;
    return entry;
  }
  const auto dim = s.scalar<std::int64_t>(node, name, expected);
  if (dim < 0 || dim > std::numeric_limits<int>::max()) s.fail(node, name, expected);
  entry.dim = static_cast<int>(dim);
  return entry;
}

// pipeline.input_chunks: a list (model order) or a map by input name;
// pipeline.target_chunks: a list (targets have no names).
std::vector<ChunkEntry> parseChunks(const Section& s, const YAML::Node& node, const std::string& name, bool by_name) {
  const std::string expected = by_name ? "a list of chunk entries (one per model input, in the model's order) or a "
                                         "map from input name to entry, each an integer dim or replicate"
                                       : fmt::format("a list of chunk entries (one per {}), each an integer dim or "
                                                     "replicate",
                                                     name == "output_chunks" ? "model output" : "target");
  std::vector<ChunkEntry> out;
  if (node.IsSequence() && node.size() > 0) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      out.push_back(parseChunkEntry(s, node[i], fmt::format("{}[{}]", name, i)));
    }
    return out;
  }
  if (by_name && node.IsMap() && node.size() > 0) {
    for (const auto& kv : node) {
      const std::string input = s.scalar<std::string>(kv.first, name, "a map keyed by model input names");
      ChunkEntry entry = parseChunkEntry(s, kv.second, fmt::format("{}.{}", name, input));
      entry.name = input;
      out.push_back(entry);
    }
    return out;
  }
  s.fail(node, name, expected);
}

void parsePipeline(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "pipeline");
  std::string csv_where;
  bool has_schedule = false;
  s.read(node, "pipeline",
         {{"schedule",
           [&](const YAML::Node& v) {
             has_schedule = true;
             std::string name = s.string(v, "schedule");
             if (const auto known = schedules::canonicalScheduleName(name)) {
               c.pipeline.schedule = *known;
               return;
             }
             std::string lower = name;
             for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
             if (lower == schedules::kAutoScheduleName) {
               c.pipeline.schedule = schedules::kAutoScheduleName;
               return;
             }
             auto names = schedules::scheduleNames();
             names.push_back(schedules::kAutoScheduleName);
             throw ConfigError(fmt::format("{}: pipeline.schedule '{}' is not a schedule; use one of {} (or "
                                           "pipeline.schedule_csv for a schedule in a CSV file)",
                                           s.where(v), name, fmt::join(names, ", ")));
           }},
          {"schedule_csv",
           [&](const YAML::Node& v) {
             c.pipeline.schedule_csv = s.string(v, "schedule_csv");
             csv_where = s.where(v);
           }},
          {"microbatches", [&](const YAML::Node& v) { c.pipeline.microbatches = s.smallInteger(v, "microbatches", 1); }},
          {"stages_per_rank",
           [&](const YAML::Node& v) { c.pipeline.stages_per_rank = s.smallInteger(v, "stages_per_rank", 1); }},
          {"data_parallel", [&](const YAML::Node& v) { c.pipeline.data_parallel = s.smallInteger(v, "data_parallel", 1); }},
          {"zero_stage", [&](const YAML::Node& v) { c.pipeline.zero_stage = s.smallInteger(v, "zero_stage", 0); }},
          {"tensor_parallel",
           [&](const YAML::Node& v) { c.pipeline.tensor_parallel = s.smallInteger(v, "tensor_parallel", 1); }},
          {"sequence_parallel",
           [&](const YAML::Node& v) { c.pipeline.sequence_parallel = s.boolean(v, "sequence_parallel"); }},
          {"loss_parallel", [&](const YAML::Node& v) { c.pipeline.loss_parallel = s.boolean(v, "loss_parallel"); }},
          {"tensor_parallel_plan",
           [&](const YAML::Node& v) {
             if (!v.IsMap()) {
               c.pipeline.tensor_parallel_plan = s.string(v, "tensor_parallel_plan");
               return;
             }
             // torchtitan's words; what Pipeforge does not build yet is named as such.
             static const std::vector<std::string> styles = {"colwise", "rowwise", "replicated", "vocab",
                                                             "embedding_rowwise"};
             c.pipeline.tensor_parallel_plan = "explicit";
             for (const auto& entry : v) {
               const std::string glob = entry.first.as<std::string>();
               const std::string style = s.string(entry.second, "tensor_parallel_plan." + glob);
               if (std::find(styles.begin(), styles.end(), style) == styles.end()) {
                 s.fail(entry.second, "tensor_parallel_plan." + glob,
                        style == "sequence_parallel" || style == "colwise_gather_output" ||
                                style == "rowwise_split_input" || style == "packed_colwise"
                            ? "colwise, rowwise, replicated or vocab (" + style +
                                  " is not built yet; pipeline.sequence_parallel: true is Megatron's sequence "
                                  "parallel)"
                            : "colwise, rowwise, replicated or vocab (embedding_rowwise)");
               }
               c.pipeline.tensor_parallel_styles.emplace_back(glob, style);
             }
           }},
          {"max_active_stages",
           [&](const YAML::Node& v) { c.pipeline.max_active_stages = s.smallInteger(v, "max_active_stages", 1); }},
          {"scale_grads", [&](const YAML::Node& v) { c.pipeline.scale_grads = s.boolean(v, "scale_grads"); }},
          {"microbatch_group_size",
           [&](const YAML::Node& v) {
             c.pipeline.microbatch_group_size = s.smallInteger(v, "microbatch_group_size", 1);
           }},
          {"activation_checkpointing",
           [&](const YAML::Node& v) { parseCheckpointing(s, v, c.pipeline); }},
          {"input_chunks", [&](const YAML::Node& v) { c.pipeline.input_chunks = parseChunks(s, v, "input_chunks", true); }},
          {"target_chunks",
           [&](const YAML::Node& v) { c.pipeline.target_chunks = parseChunks(s, v, "target_chunks", false); }},
          {"output_chunks",
           [&](const YAML::Node& v) { c.pipeline.output_chunks = parseChunks(s, v, "output_chunks", false); }},
          {"memory_limit",
           [&](const YAML::Node& v) {
             const std::string text = s.string(v, "memory_limit");
             const std::optional<double> bytes = parseByteSize(text);
             if (!bytes || *bytes <= 0) {
               throw ConfigError(fmt::format("{}: pipeline.memory_limit '{}' is not a size; write bytes with a unit, "
                                             "per rank, e.g. 6GiB or 512MB",
                                             s.where(v), text));
             }
             c.pipeline.memory_limit = *bytes;
           }}});
  auto& p = c.pipeline;
  if (csv_where.empty()) return;
  if (has_schedule) {
    throw ConfigError(fmt::format("{}: pipeline.schedule and pipeline.schedule_csv are both set; keep one: schedule "
                                  "names a schedule to generate (or auto), schedule_csv reads one from a file",
                                  s.where(node)));
  }
  requireFile(top.origin(), "pipeline.schedule_csv", p.schedule_csv);
  std::error_code ec;
  if (!fs::is_regular_file(p.schedule_csv, ec)) {
    throw ConfigError(fmt::format("{}: pipeline.schedule_csv '{}' is not a regular file; give a CSV file such as "
                                  "`pipeforge schedule ... --csv` or PyTorch's _dump_csv writes",
                                  csv_where, p.schedule_csv));
  }
  p.csv_program = readScheduleCsv(csv_where, p.schedule_csv);
  if (p.csv_program->num_microbatches != p.microbatches) {
    throw ConfigError(fmt::format("{}: pipeline.schedule_csv '{}' runs {} microbatches (0..{}) but "
                                  "pipeline.microbatches is {}; set pipeline.microbatches: {} or use a schedule for {}",
                                  csv_where, p.schedule_csv, p.csv_program->num_microbatches,
                                  p.csv_program->num_microbatches - 1, p.microbatches,
                                  p.csv_program->num_microbatches, p.microbatches));
  }
}

void parseOptimizer(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "optimizer");
  auto& o = c.optimizer;
  s.read(node, "optimizer",
         {{"name",
           [&](const YAML::Node& v) {
             o.name = s.choice<OptimizerName>(
                 v, "name", {{"sgd", OptimizerName::kSgd}, {"adam", OptimizerName::kAdam}, {"adamw", OptimizerName::kAdamW}});
           }},
          {"lr", [&](const YAML::Node& v) { o.lr = s.number(v, "lr", 0.0, false); }},
          {"weight_decay", [&](const YAML::Node& v) { o.weight_decay = s.number(v, "weight_decay", 0.0, true); }},
          {"eps", [&](const YAML::Node& v) { o.eps = s.number(v, "eps", 0.0, false); }},
          {"momentum", [&](const YAML::Node& v) { o.momentum = s.number(v, "momentum", 0.0, true); }},
          {"nesterov", [&](const YAML::Node& v) { o.nesterov = s.boolean(v, "nesterov"); }},
          {"foreach", [&](const YAML::Node& v) { o.foreach = s.boolean(v, "foreach"); }},
          {"fused", [&](const YAML::Node& v) { o.fused = s.boolean(v, "fused"); }},
          {"clip_grad_norm", [&](const YAML::Node& v) { o.clip_grad_norm = s.number(v, "clip_grad_norm", 0.0, true); }},
          {"no_decay",
           [&](const YAML::Node& v) {
             const char* expected = "a list of parameter-name globs, e.g. [\"*.bias\", \"*ln*\", \"wte.*\"]";
             if (!v.IsSequence()) s.fail(v, "no_decay", expected);
             o.no_decay.clear();
             for (const auto& item : v) {
               auto pattern = s.scalar<std::string>(item, "no_decay", expected);
               if (pattern.empty()) s.fail(item, "no_decay", expected);
               o.no_decay.push_back(pattern);
             }
           }},
          {"betas", [&](const YAML::Node& v) {
             const char* expected = "a list of two numbers in [0, 1), e.g. [0.9, 0.95]";
             if (!v.IsSequence() || v.size() != 2) s.fail(v, "betas", expected);
             for (int k = 0; k < 2; ++k) {
               o.betas[k] = s.scalar<double>(v[k], "betas", expected);
               if (!(o.betas[k] >= 0.0 && o.betas[k] < 1.0)) s.fail(v, "betas", expected);
             }
           }}});
  if (o.nesterov && (o.name != OptimizerName::kSgd || o.momentum <= 0.0)) {
    throw ConfigError(fmt::format("{}: optimizer.nesterov needs optimizer.name: sgd and optimizer.momentum > 0",
                                  s.where(node)));
  }
  if (o.foreach && o.fused) {
    throw ConfigError(fmt::format("{}: optimizer.foreach and optimizer.fused cannot both be true, as in PyTorch; "
                                  "keep one (fused is the faster)",
                                  s.where(node)));
  }
  if ((o.foreach || o.fused) && o.name == OptimizerName::kSgd) {
    throw ConfigError(fmt::format("{}: optimizer.{} applies to adam and adamw; remove it for optimizer.name: sgd",
                                  s.where(node), o.fused ? "fused" : "foreach"));
  }
}

void parseLrSchedule(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "lr_schedule");
  auto& l = c.lr_schedule;
  s.read(node, "lr_schedule",
         {{"decay",
           [&](const YAML::Node& v) {
             l.decay = s.choice<LrDecay>(v, "decay", {{"cosine", LrDecay::kCosine}, {"constant", LrDecay::kConstant}});
           }},
          {"warmup_steps", [&](const YAML::Node& v) { l.warmup_steps = s.integer(v, "warmup_steps", 0); }},
          {"decay_steps", [&](const YAML::Node& v) { l.decay_steps = s.integer(v, "decay_steps", 1); }},
          {"min_lr", [&](const YAML::Node& v) { l.min_lr = s.number(v, "min_lr", 0.0, true); }}});
}

void parseData(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "data");
  auto& d = c.data;
  bool has_dtype = false;
  bool has_format = false;
  s.read(node, "data",
         {{"format",
           [&](const YAML::Node& v) {
             has_format = true;
             d.format = s.choice<DataFormat>(
                 v, "format", {{"tokens", DataFormat::kTokens}, {"text", DataFormat::kText}, {"tensors", DataFormat::kTensors}});
           }},
          {"path", [&](const YAML::Node& v) { d.path = s.string(v, "path"); }},
          {"val_path", [&](const YAML::Node& v) { d.val_path = s.string(v, "val_path"); }},
          {"val_fraction",
           [&](const YAML::Node& v) {
             d.val_fraction = s.number(v, "val_fraction", 0.0, true);
             if (d.val_fraction >= 1.0) s.fail(v, "val_fraction", "a number in [0, 1)");
           }},
          {"dtype",
           [&](const YAML::Node& v) {
             has_dtype = true;
             d.dtype = s.choice<TokenDtype>(v, "dtype", {{"uint16", TokenDtype::kUint16}, {"uint32", TokenDtype::kUint32}});
           }},
          {"block_size", [&](const YAML::Node& v) { d.block_size = s.integer(v, "block_size", 1); }},
          {"packing",
           [&](const YAML::Node& v) {
             d.packing = s.choice<Packing>(v, "packing", {{"windows", Packing::kWindows}, {"none", Packing::kNone}});
           }},
          {"document_separator",
           [&](const YAML::Node& v) { d.document_separator = s.integer(v, "document_separator", 0); }}});
  const std::string o = top.origin();
  if (!has_format) throw ConfigError(fmt::format("{}: data.format is missing; use tokens, text or tensors", s.where(node)));
  if (d.path.empty()) throw ConfigError(fmt::format("{}: data.path is missing", s.where(node)));
  requireFile(o, "data.path", d.path);
  if (!d.val_path.empty()) requireFile(o, "data.val_path", d.val_path);
  switch (d.format) {
    case DataFormat::kText:
      if (has_dtype) throw ConfigError(fmt::format("{}: data.dtype does not apply to format text (one byte per token)", s.where(node)));
      d.dtype = TokenDtype::kUint8;
      [[fallthrough]];
    case DataFormat::kTokens:
      if (d.block_size == 0) {
        throw ConfigError(fmt::format("{}: data.block_size is missing; token data needs the sequence length, e.g. 64",
                                      s.where(node)));
      }
      if (d.packing == Packing::kNone && d.document_separator < 0) {
        throw ConfigError(fmt::format("{}: data.packing: none cuts the stream into documents, which needs "
                                      "data.document_separator, the token that ends each one (GPT-2's "
                                      "<|endoftext|> is 50256)",
                                      s.where(node)));
      }
      if (d.packing == Packing::kWindows && d.document_separator >= 0) {
        throw ConfigError(fmt::format("{}: data.document_separator applies to data.packing: none only; add "
                                      "packing: none for one document per row, or remove the key",
                                      s.where(node)));
      }
      return;
    case DataFormat::kTensors:
      if (d.block_size != 0 || has_dtype || d.packing != Packing::kWindows || d.document_separator >= 0) {
        throw ConfigError(fmt::format("{}: data.block_size, data.dtype, data.packing and data.document_separator "
                                      "apply to token data only",
                                      s.where(node)));
      }
      return;
  }
}

void parseTraining(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "training");
  bool has_steps = false, has_batch = false;
  std::optional<YAML::Node> loss_scale;
  s.read(node, "training",
         {{"steps",
           [&](const YAML::Node& v) {
             c.steps = s.integer(v, "steps", 1);
             has_steps = true;
           }},
          {"global_batch_size",
           [&](const YAML::Node& v) {
             c.global_batch_size = s.integer(v, "global_batch_size", 1);
             has_batch = true;
           }},
          {"seed", [&](const YAML::Node& v) { c.seed = static_cast<std::uint64_t>(s.integer(v, "seed", 0)); }},
          {"eval_every", [&](const YAML::Node& v) { c.eval_every = s.integer(v, "eval_every", 0); }},
          {"eval_batches", [&](const YAML::Node& v) { c.eval_batches = s.integer(v, "eval_batches", 1); }},
          {"on_nonfinite",
           [&](const YAML::Node& v) {
             c.on_nonfinite = s.choice<NonFinitePolicy>(
                 v, "on_nonfinite", {{"stop", NonFinitePolicy::kStop}, {"skip_step", NonFinitePolicy::kSkipStep}});
           }},
          {"precision",
           [&](const YAML::Node& v) {
             c.precision = s.choice<PrecisionName>(
                 v, "precision", {{"fp32", PrecisionName::kFp32}, {"bf16", PrecisionName::kBf16}, {"fp16", PrecisionName::kFp16}});
           }},
          {"loss_scale", [&](const YAML::Node& v) { loss_scale = v; }}});
  if (loss_scale) {
    if (c.precision != PrecisionName::kFp16) {
      throw ConfigError(fmt::format("{}: training.loss_scale applies to training.precision fp16 only (precision is "
                                    "{}); remove it, or set precision: fp16",
                                    s.where(*loss_scale), precisionName(c.precision)));
    }
    Section ls(top, "training.loss_scale");
    ls.read(*loss_scale, "training.loss_scale",
            {{"initial",
              [&](const YAML::Node& v) {
                c.loss_scale.initial = ls.number(v, "initial", 0.0, false);
                if (c.loss_scale.initial > std::numeric_limits<float>::max()) {
                  ls.fail(v, "initial", "a number > 0 that fits float32 (at most 3.4e38)");
                }
              }},
             {"growth_interval",
              [&](const YAML::Node& v) { c.loss_scale.growth_interval = ls.smallInteger(v, "growth_interval", 1); }}});
  }
  if (!has_steps) throw ConfigError(fmt::format("{}: training.steps is missing", s.where(node)));
  if (!has_batch) throw ConfigError(fmt::format("{}: training.global_batch_size is missing", s.where(node)));
}

void parseCheckpoint(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "checkpoint");
  s.read(node, "checkpoint",
         {{"dir", [&](const YAML::Node& v) { c.checkpoint.dir = s.string(v, "dir"); }},
          {"every", [&](const YAML::Node& v) { c.checkpoint.every = s.integer(v, "every", 0); }},
          {"keep", [&](const YAML::Node& v) { c.checkpoint.keep = s.smallInteger(v, "keep", 0); }},
          {"resume", [&](const YAML::Node& v) { c.checkpoint.resume = s.boolean(v, "resume"); }}});
}

void parseDistributed(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "distributed");
  s.read(node, "distributed",
         {{"device",
           [&](const YAML::Node& v) {
             c.device = s.string(v, "device");
             bool ok = c.device == "cpu" || c.device == "cuda";
             if (!ok && c.device.rfind("cuda:", 0) == 0 && c.device.size() > 5) {
               ok = c.device.find_first_not_of("0123456789", 5) == std::string::npos;
             }
             if (!ok) s.fail(v, "device", "cpu, cuda (one GPU per local rank) or cuda:N");
           }},
          {"backend",
           [&](const YAML::Node& v) {
             c.backend = s.choice<std::string>(v, "backend", {{"auto", "auto"}, {"gloo", "gloo"}, {"nccl", "nccl"}});
           }},
          {"cpu_affinity",
           [&](const YAML::Node& v) {
             c.cpu_affinity = s.choice<bool>(v, "cpu_affinity", {{"auto", true}, {"none", false}});
           }},
          {"timeout_s", [&](const YAML::Node& v) { c.timeout_s = s.number(v, "timeout_s", 0.0, false); }}});
  if (c.backend == "nccl" && c.device == "cpu") {
    throw ConfigError(fmt::format("{}: distributed.backend nccl needs distributed.device cuda; use gloo on cpu",
                                  s.where(node)));
  }
}

void parseOutput(const Section& top, const YAML::Node& node, TrainConfig& c) {
  Section s(top, "output");
  s.read(node, "output",
         {{"dir", [&](const YAML::Node& v) { c.output_dir = s.string(v, "dir"); }},
          {"log_every", [&](const YAML::Node& v) { c.log_every = s.integer(v, "log_every", 1); }},
          {"trace", [&](const YAML::Node& v) { c.trace = s.boolean(v, "trace"); }},
          {"trace_steps", [&](const YAML::Node& v) { c.trace_steps = s.integer(v, "trace_steps", 1); }}});
}

void checkCrossKeys(const TrainConfig& c) {
  const std::string& o = c.origin;
  const auto& p = c.pipeline;
  if (c.global_batch_size % p.data_parallel != 0) {
    throw ConfigError(fmt::format("{}: training.global_batch_size {} is not divisible by pipeline.data_parallel {}; "
                                  "each replica needs the same number of rows",
                                  o, c.global_batch_size, p.data_parallel));
  }
  if (p.zero_stage < 0 || p.zero_stage > 3) {
    throw ConfigError(fmt::format("{}: pipeline.zero_stage {} is not a ZeRO stage; use 0 (no sharding), 1 "
                                  "(optimizer state sharded over the data-parallel replicas), 2 (gradients too) or 3 "
                                  "(parameters too)",
                                  o, p.zero_stage));
  }
  if (p.zero_stage >= 1 && p.data_parallel < 2) {
    throw ConfigError(fmt::format("{}: pipeline.zero_stage {} shards over the data-parallel replicas, and "
                                  "pipeline.data_parallel is {}; set pipeline.data_parallel to 2 or more, or "
                                  "pipeline.zero_stage: 0",
                                  o, p.zero_stage, p.data_parallel));
  }
  if (p.tensor_parallel_plan != "auto" && p.tensor_parallel_plan != "explicit") {
    throw ConfigError(fmt::format("{}: pipeline.tensor_parallel_plan '{}' is not a plan Pipeforge has; use auto (the "
                                  "column/row splits found in each stage's graph), or a map from module FQN globs "
                                  "to colwise, rowwise, replicated or vocab",
                                  o, p.tensor_parallel_plan));
  }
  if (p.sequence_parallel && p.tensor_parallel < 2) {
    throw ConfigError(fmt::format("{}: pipeline.sequence_parallel splits the sequence over the tensor-parallel "
                                  "group, and pipeline.tensor_parallel is {}; set pipeline.tensor_parallel to 2 or "
                                  "more, or remove sequence_parallel",
                                  o, p.tensor_parallel));
  }
  if (p.tensor_parallel > 1) {
    // What tensor parallel does not compose with yet, refused before any rank starts.
    auto refuse = [&](const std::string& what, const std::string& fix) {
      throw ConfigError(fmt::format("{}: pipeline.tensor_parallel {} does not run with {} yet; {}", o,
                                    p.tensor_parallel, what, fix));
    };
    // Full and per-microbatch recompute run the rewritten stage again, its
    // collectives with it (every rank of the group recomputes in step).
    // every_n counts the stage's submodule calls, which the tensor-parallel
    // rewrite opens into one graph: it would find none to recompute.
    if (p.activation_checkpointing == ActivationCheckpointing::kEveryN) {
      refuse("activation_checkpointing {every_n: k} (the tensor-parallel rewrite opens every submodule call into "
             "one graph, so there is no call to count)",
             "use activation_checkpointing: full, or {microbatches: k}");
    }
    if (!p.csv_program && p.schedule == schedules::kAutoScheduleName) {
      refuse("pipeline.schedule: auto", "name a schedule (1F1B, Interleaved1F1B, ZBVZeroBubble, ...)");
    }
  }
  const std::int64_t per_replica = c.global_batch_size / p.data_parallel;
  if (per_replica % p.microbatches != 0) {
    throw ConfigError(fmt::format("{}: training.global_batch_size {} gives {} rows per replica, which "
                                  "pipeline.microbatches {} does not divide; use a batch size that is a multiple of {}",
                                  o, c.global_batch_size, per_replica, p.microbatches,
                                  static_cast<std::int64_t>(p.microbatches) * p.data_parallel));
  }
  if (c.lr_schedule.min_lr > c.optimizer.lr) {
    throw ConfigError(fmt::format("{}: lr_schedule.min_lr {} is above optimizer.lr {}", o, c.lr_schedule.min_lr,
                                  c.optimizer.lr));
  }
  if (c.eval_every > 0 && c.data.val_path.empty() && c.data.val_fraction == 0.0) {
    throw ConfigError(fmt::format("{}: training.eval_every {} needs held-out data: set data.val_path or "
                                  "data.val_fraction > 0",
                                  o, c.eval_every));
  }
  if (c.output_dir.empty()) throw ConfigError(fmt::format("{}: output.dir is missing (metrics, trace and the split go there)", o));
  if (!p.scale_grads && c.loss_normalization == LossNormalization::kPerToken) {
    throw ConfigError(fmt::format("{}: pipeline.scale_grads: false sums the microbatches' losses, but "
                                  "loss_normalization: per_token already divides the summed loss by the tokens "
                                  "counted; keep one: remove pipeline.scale_grads, or use loss_normalization: "
                                  "per_microbatch",
                                  o));
  }
  if ((!p.input_chunks.empty() || !p.target_chunks.empty()) && c.data.format != DataFormat::kTensors) {
    throw ConfigError(fmt::format("{}: pipeline.{} needs data.format: tensors; token data is one input and one "
                                  "target, both split along dim 0; remove the key",
                                  o, p.input_chunks.empty() ? "target_chunks" : "input_chunks"));
  }
  for (const ChunkEntry& t : p.target_chunks) {
    if (t.replicate && c.loss_normalization == LossNormalization::kPerToken) {
      throw ConfigError(fmt::format("{}: pipeline.target_chunks replicates a target, which loss_normalization: "
                                    "per_token would count once but every microbatch uses; split the target or use "
                                    "loss_normalization: per_microbatch",
                                    t.where));
    }
  }
  if (c.loss == LossName::kMse && c.data.format != DataFormat::kTensors) {
    throw ConfigError(fmt::format("{}: loss mse needs float targets; token data (data.format {}) has integer targets, "
                                  "use loss: cross_entropy",
                                  o, c.data.format == DataFormat::kText ? "text" : "tokens"));
  }
}

}  // namespace

TrainConfig parseTrainConfig(const std::string& yaml_text, const std::string& origin,
                             const std::vector<ConfigOverride>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(describeYamlError(yaml_text, origin, e.mark.line, e.mark.column, e.msg));
  }
  // yaml-cpp keeps both of a repeated key and the later one would win silently.
  if (auto duplicate = findDuplicateKey(root, origin)) throw ConfigError(*duplicate);
  const OverrideLabels labels = applyOverrides(root, overrides, origin);
  TrainConfig c;
  c.origin = origin;
  Section top(origin, "", &labels);
  bool seen_model = false, seen_data = false, seen_training = false, seen_output = false;
  top.read(root, "a training config",
           {{"model",
             [&](const YAML::Node& v) {
               parseModel(top, v, c);
               seen_model = true;
             }},
            {"pipeline", [&](const YAML::Node& v) { parsePipeline(top, v, c); }},
            {"loss",
             [&](const YAML::Node& v) {
               if (v.IsMap()) {
                 Section s(top, "loss");
                 s.read(v, "loss", {{"module", [&](const YAML::Node& m) { c.loss_module = s.string(m, "module"); }}});
                 if (c.loss_module.empty()) {
                   throw ConfigError(fmt::format("{}: loss: {{module: ...}} needs the path of a scripted (.pt) or "
                                                 "exported (.pt2) module (outputs..., targets...) -> scalar",
                                                 top.where(v)));
                 }
                 requireFile(origin, "loss.module", c.loss_module);
                 c.loss = LossName::kModule;
                 return;
               }
               c.loss = top.choice<LossName>(
                   v, "loss (or a map {module: path/to/loss.pt})",
                   {{"cross_entropy", LossName::kCrossEntropy}, {"mse", LossName::kMse}});
             }},
            {"loss_normalization",
             [&](const YAML::Node& v) {
               c.loss_normalization = top.choice<LossNormalization>(
                   v, "loss_normalization",
                   {{"per_microbatch", LossNormalization::kPerMicrobatch}, {"per_token", LossNormalization::kPerToken}});
             }},
            {"optimizer", [&](const YAML::Node& v) { parseOptimizer(top, v, c); }},
            {"lr_schedule", [&](const YAML::Node& v) { parseLrSchedule(top, v, c); }},
            {"data",
             [&](const YAML::Node& v) {
               parseData(top, v, c);
               seen_data = true;
             }},
            {"training",
             [&](const YAML::Node& v) {
               parseTraining(top, v, c);
               seen_training = true;
             }},
            {"checkpoint", [&](const YAML::Node& v) { parseCheckpoint(top, v, c); }},
            {"distributed", [&](const YAML::Node& v) { parseDistributed(top, v, c); }},
            {"output",
             [&](const YAML::Node& v) {
               parseOutput(top, v, c);
               seen_output = true;
             }}});
  for (auto [seen, name] : {std::pair{seen_model, "model"}, {seen_data, "data"}, {seen_training, "training"},
                            {seen_output, "output"}}) {
    if (!seen) throw ConfigError(fmt::format("{}: section '{}' is missing; see configs/train_example.yaml", origin, name));
  }
  checkCrossKeys(c);
  return c;
}

TrainConfig loadTrainConfig(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("training config '{}' cannot be read; check the path", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return parseTrainConfig(buffer.str(), path, overrides);
}

std::optional<schedules::Program> checkLayout(const TrainConfig& c, int world_size, int num_stages) {
  const auto& p = c.pipeline;
  if (world_size < 1 || world_size % (p.data_parallel * p.tensor_parallel) != 0) {
    if (p.tensor_parallel > 1) {
      throw ConfigError(fmt::format("{}: {} cannot hold pipeline.tensor_parallel {} x pipeline.data_parallel {}; the "
                                    "world size must be a multiple of {}",
                                    c.origin, counted(world_size, "rank"), p.tensor_parallel, p.data_parallel,
                                    p.tensor_parallel * p.data_parallel));
    }
    throw ConfigError(fmt::format("{}: {} cannot hold pipeline.data_parallel {} replicas; the world size must be "
                                  "a multiple of it",
                                  c.origin, counted(world_size, "rank"), p.data_parallel));
  }
  const int pp = mesh::MeshLayout::fromWorld(world_size, p.tensor_parallel, p.data_parallel).size(mesh::Axis::kPp);
  if (p.memory_limit && (p.csv_program || p.schedule != schedules::kAutoScheduleName)) {
    throw ConfigError(fmt::format("{}: pipeline.memory_limit is a limit for pipeline.schedule: auto, which measures "
                                  "the stages' memory and keeps the schedule's simulated peak under it; {} is fixed. "
                                  "Set pipeline.schedule: auto, or remove memory_limit",
                                  c.origin, p.csv_program ? "pipeline.schedule_csv" : p.schedule));
  }
  if (p.microbatch_group_size != 0 && (p.csv_program || p.schedule != "MegatronInterleaved")) {
    throw ConfigError(fmt::format("{}: pipeline.microbatch_group_size is Megatron's microbatch_group_size_per_vp_stage "
                                  "and applies to pipeline.schedule: MegatronInterleaved only, not {}; remove it",
                                  c.origin, p.csv_program ? "pipeline.schedule_csv" : p.schedule));
  }
  if (p.csv_program) {
    // The CSV fixes the ranks and stages; say so before the generic layout message.
    const schedules::Program& csv = *p.csv_program;
    if (csv.num_ranks != pp) {
      throw ConfigError(fmt::format("{}: pipeline.schedule_csv '{}' has {} rows (pipeline ranks) but the job has {} "
                                    "pipeline ranks ({} ranks / pipeline.data_parallel {}); run {} ranks (--nproc), or "
                                    "use a schedule for {} ranks",
                                    c.origin, p.schedule_csv, csv.num_ranks, pp, world_size, p.data_parallel,
                                    static_cast<std::int64_t>(csv.num_ranks) * p.data_parallel, pp));
    }
    if (csv.num_stages != num_stages) {
      throw ConfigError(fmt::format("{}: pipeline.schedule_csv '{}' runs {} stages (0..{}) but the split has {}; split "
                                    "into {} stages (model.num_stages), or use a schedule for {} stages",
                                    c.origin, p.schedule_csv, csv.num_stages, csv.num_stages - 1, num_stages,
                                    csv.num_stages, num_stages));
    }
  }
  const std::int64_t stages_needed = static_cast<std::int64_t>(pp) * p.stages_per_rank;  // int would overflow
  if (num_stages != stages_needed) {
    // Every way out that fits: another split, another rank count, or the
    // extra ranks as data-parallel replicas.
    // The split fix names where this config's split is set: each fix a message
    // names must work as written.
    std::string resplit;
    if (!c.model.split_dir.empty()) {
      resplit = fmt::format("split the model again into {} (`pipeforge split` with num_stages: {} in its spec) and "
                            "set model.split_dir to that folder",
                            counted(stages_needed, "stage"), stages_needed);
    } else if (!c.model.split_spec.empty()) {
      resplit = fmt::format("split into {} (num_stages: {} in model.split_spec '{}')", counted(stages_needed, "stage"),
                            stages_needed, c.model.split_spec);
    } else {
      resplit = fmt::format("split into {} (model.num_stages: {})", counted(stages_needed, "stage"), stages_needed);
    }
    std::vector<std::string> fixes{resplit};
    if (num_stages % p.stages_per_rank == 0) {
      const std::int64_t ranks =
          static_cast<std::int64_t>(num_stages / p.stages_per_rank) * p.data_parallel * p.tensor_parallel;
      fixes.push_back(fmt::format("run {} (--nproc {})", counted(ranks, "rank"), ranks));
      const int stage_ranks = num_stages / p.stages_per_rank * p.tensor_parallel;
      if (world_size % stage_ranks == 0 && world_size / stage_ranks != p.data_parallel) {
        fixes.push_back(fmt::format("train {} replicas of the {} (pipeline.data_parallel: {})",
                                    world_size / stage_ranks, counted(num_stages, "stage"), world_size / stage_ranks));
      }
    }
    const std::string divisor =
        p.tensor_parallel > 1 ? fmt::format("(pipeline.tensor_parallel {} x pipeline.data_parallel {})",
                                            p.tensor_parallel, p.data_parallel)
                              : fmt::format("pipeline.data_parallel {}", p.data_parallel);
    throw ConfigError(fmt::format("{}: {} {} {} ({} / {}, x pipeline.stages_per_rank {}) "
                                  "and need {}, but the split has {}; {}",
                                  c.origin, counted(world_size, "rank"), world_size == 1 ? "makes" : "make",
                                  counted(pp, "pipeline rank"), world_size, divisor, p.stages_per_rank,
                                  counted(stages_needed, "stage"), num_stages, joinChoices(fixes)));
  }
  // A CSV was checked above; `auto` finds a schedule for any layout.
  if (p.csv_program) return p.csv_program;
  if (p.schedule == schedules::kAutoScheduleName) return std::nullopt;
  schedules::ScheduleConfig sc;
  sc.num_ranks = pp;
  sc.stages_per_rank = p.stages_per_rank;
  sc.num_microbatches = p.microbatches;
  sc.microbatch_group_size_per_vp_stage = p.microbatch_group_size;
  try {
    return schedules::generateSchedule(p.schedule, sc);
  } catch (const schedules::ScheduleError& e) {
    throw ConfigError(fmt::format("{}: pipeline.schedule {} with {} pipeline ranks, stages_per_rank {} and "
                                  "microbatches {}: {}",
                                  c.origin, p.schedule, pp, p.stages_per_rank, p.microbatches, e.what()));
  }
}

std::vector<ChunkEntry> inputChunksFor(const TrainConfig& config, const std::vector<std::string>& model_inputs) {
  const auto& given = config.pipeline.input_chunks;
  if (given.empty()) return {};
  const std::string names = fmt::format("[{}]", fmt::join(model_inputs, ", "));
  if (given.front().name.empty()) {
    if (given.size() != model_inputs.size()) {
      throw ConfigError(fmt::format("{}: pipeline.input_chunks has {} entries but the model takes {} inputs {}; give "
                                    "one entry per input, in that order, or a map by input name",
                                    given.front().where, given.size(), model_inputs.size(), names));
    }
    return given;
  }
  std::vector<ChunkEntry> out(model_inputs.size());
  for (std::size_t i = 0; i < model_inputs.size(); ++i) out[i].name = model_inputs[i];
  for (const ChunkEntry& entry : given) {
    auto it = std::find(model_inputs.begin(), model_inputs.end(), entry.name);
    if (it == model_inputs.end()) {
      throw ConfigError(fmt::format("{}: pipeline.input_chunks names '{}', which is not an input of the model; its "
                                    "inputs are {}",
                                    entry.where, entry.name, names));
    }
    out[static_cast<std::size_t>(it - model_inputs.begin())] = entry;
  }
  return out;
}

std::string scheduleLabel(const TrainConfig& config) {
  return config.pipeline.schedule_csv.empty() ? config.pipeline.schedule : config.pipeline.schedule_csv;
}

std::int64_t replicaBatchSize(const TrainConfig& config) {
  return config.global_batch_size / config.pipeline.data_parallel;
}

const char* lossName(LossName loss) {
  switch (loss) {
    case LossName::kCrossEntropy: return "cross_entropy";
    case LossName::kMse: return "mse";
    case LossName::kModule: return "module";
  }
  return "?";
}

const char* precisionName(PrecisionName name) {
  switch (name) {
    case PrecisionName::kFp32: return "fp32";
    case PrecisionName::kBf16: return "bf16";
    case PrecisionName::kFp16: return "fp16";
  }
  return "?";
}

const char* optimizerName(OptimizerName name) {
  switch (name) {
    case OptimizerName::kSgd: return "sgd";
    case OptimizerName::kAdam: return "adam";
    case OptimizerName::kAdamW: return "adamw";
  }
  return "?";
}

}  // namespace pipeforge::train
