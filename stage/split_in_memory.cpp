#include "stage/split_in_memory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "common/dtype_names.h"
#include "common/error.h"
#include "partitioner/policy_search.h"
#include "stage/constant_inputs.h"
#include "stage/run_chained.h"
#include "stage/value_meta.h"

namespace pipeforge::stage {
namespace {

using partitioner::SpecError;

// The line of a TorchScript interpreter error that says what went wrong
// ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x5 and 8x16)").
std::string errorSummary(const std::string& what) {
  std::string best;
  size_t start = 0;
  while (start < what.size()) {
    size_t end = what.find('\n', start);
    std::string line = what.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (line.find("Error: ") != std::string::npos) best = line;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (!best.empty()) return best;
  return what.substr(0, what.find('\n'));
}

// Note [Index ranges of example inputs]: "index out of range in self" from a
// forward on example inputs almost always means an integer input's `high`
// exceeds the rows of the embedding it indexes. The forward graph (inlined)
// says which embedding each argument indexes directly; the hint names the
// input, its range and that embedding's rows. nullopt when no integer input
// indexes an embedding too small for it.
std::string attributePath(torch::jit::Value* value, const torch::jit::Value* self) {
  std::vector<std::string> parts;
  while (value->node()->kind() == c10::prim::GetAttr) {
    parts.insert(parts.begin(), value->node()->s(c10::attr::name));
    value = value->node()->input(0);
  }
  return value == self ? fmt::format("{}", fmt::join(parts, ".")) : std::string();
}

}  // namespace

std::vector<InputEmbedding> inputEmbeddings(const torch::jit::Module& model) {
  std::shared_ptr<torch::jit::Graph> graph = model.get_method("forward").graph()->copy();
  torch::jit::Inline(*graph);
  const torch::jit::Value* self = graph->inputs().at(0);
  const auto& args = graph->inputs();
  std::vector<InputEmbedding> out(args.size() - 1);
  bool any = false;
  for (torch::jit::Node* node : graph->nodes()) {
    if (node->kind() != c10::aten::embedding) continue;
    const auto it = std::find(args.begin(), args.end(), node->input(1));
    if (it == args.end() || it == args.begin()) continue;
    InputEmbedding& entry = out[static_cast<std::size_t>(it - args.begin()) - 1];
    if (!entry.module.empty()) continue;  // the first embedding that reads it
    const std::string path = attributePath(node->input(0), self);
    if (path.empty()) continue;
    c10::IValue weight = model._ivalue();
    std::size_t start = 0;
    while (weight.isObject()) {
      const std::size_t dot = path.find('.', start);
      weight = weight.toObjectRef().getAttr(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (!weight.isTensor() || weight.toTensor().dim() != 2) continue;
    entry.rows = weight.toTensor().size(0);
    entry.module = path.size() > 7 && path.compare(path.size() - 7, 7, ".weight") == 0
                       ? path.substr(0, path.size() - 7)
                       : path;
    any = true;
  }
  if (!any) out.clear();
  return out;
}

namespace {

std::optional<std::string> embeddingRangeHint(const torch::jit::Module& model, const partitioner::SplitSpec& spec) {
  const std::vector<InputEmbedding> embeddings = inputEmbeddings(model);
  for (std::size_t i = 0; i < embeddings.size() && i < spec.example_inputs.size(); ++i) {
    const InputEmbedding& e = embeddings[i];
    if (e.module.empty()) continue;
    const partitioner::ExampleInput& in = spec.example_inputs[i];
    const auto dtype = parseDtype(in.dtype);
    if (!dtype || (*dtype != Dtype::kInt64 && *dtype != Dtype::kInt32)) continue;
    const double high = in.high > in.low ? in.high : in.low + 2;
    if (high <= static_cast<double>(e.rows)) continue;
    return fmt::format("example_inputs[{}] draws integers in [{}, {}), but it indexes embedding '{}', which has {} "
                       "rows (indices 0..{}); set example_inputs[{}].high to at most {}",
                       i, in.low, high, e.module, e.rows, e.rows - 1, i, e.rows);
  }
  return std::nullopt;
}

// The split spec checked the name (parseDtype); an unknown one is a bug.
at::ScalarType dtypeOf(const std::string& name) {
  auto dtype = parseDtype(name);
  PIPEFORGE_CHECK(dtype.has_value(), "example input dtype '" + name + "' was not checked by the split spec");
  switch (*dtype) {
    case Dtype::kFloat32:
      return at::kFloat;
    case Dtype::kFloat64:
      return at::kDouble;
    case Dtype::kFloat16:
      return at::kHalf;
    case Dtype::kBFloat16:
      return at::kBFloat16;
    case Dtype::kInt64:
      return at::kLong;
    case Dtype::kInt32:
      return at::kInt;
    case Dtype::kBool:
      return at::kBool;
  }
  PIPEFORGE_FAIL("unhandled Dtype");
}

// Stage modules share their tensors with the model. Running them on example
// inputs must not change what gets saved: a counter's `add_` or BatchNorm's
// running statistics in training mode would, so they run on private copies.
std::vector<torch::jit::Module> privateCopies(const std::vector<torch::jit::Module>& modules) {
  std::vector<torch::jit::Module> copies;
  copies.reserve(modules.size());
  for (const auto& m : modules) copies.push_back(m.deepcopy());
  return copies;
}

// Runs the example inputs through private copies of the stages and records
// the dtype and shape of every model input and stage output in the manifest.
void recordValueMeta(BuiltStages& stages, const partitioner::SplitSpec& spec) {
  if (spec.example_inputs.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<c10::IValue> inputs = makeExampleInputs(spec);
  for (const auto& in : inputs) stages.manifest.input_meta.push_back(tensorMeta(in.toTensor()));
  std::vector<std::vector<at::Tensor>> outs;
  std::vector<torch::jit::Module> copies = privateCopies(stages.modules);
  runChained(copies, stages.manifest, inputs, nullptr, &outs);
  for (size_t k = 0; k < outs.size(); ++k) {
    for (const auto& t : outs[k]) stages.manifest.stages[k].output_meta.push_back(tensorMeta(t));
  }
}

// Each unit as its own stage, timed on the example inputs (best of 3 after a warm-up).
std::vector<double> measureUnitCosts(const frontend::OpenedModel& opened, const frontend::ModelDag& dag,
                                     const partitioner::SplitSpec& spec, const std::vector<size_t>& unit_starts) {
  partitioner::Partition per_unit = partitioner::partitionAtStarts(dag, unit_starts);
  BuiltStages stages = buildStages(opened, dag, per_unit);
  stages.modules = privateCopies(stages.modules);
  auto inputs = makeExampleInputs(spec);
  torch::NoGradGuard no_grad;
  std::vector<double> best(per_unit.num_stages, std::numeric_limits<double>::infinity());
  for (int rep = 0; rep < 4; ++rep) {
    std::vector<double> seconds;
    runChained(stages.modules, stages.manifest, inputs, &seconds);
    if (rep == 0) continue;  // warm-up
    for (size_t i = 0; i < seconds.size(); ++i) best[i] = std::min(best[i], seconds[i]);
  }
  return best;
}

}  // namespace

std::string tensorMeta(const at::Tensor& t) {
  return formatValueMeta({canonicalDtypeName(c10::toString(t.scalar_type())), t.sizes().vec()});
}

std::vector<c10::IValue> makeExampleInputs(const partitioner::SplitSpec& spec) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  std::vector<c10::IValue> inputs;
  for (const auto& in : spec.example_inputs) {
    auto dtype = dtypeOf(in.dtype);
    auto options = torch::TensorOptions().dtype(dtype);
    at::Tensor t;
    if (dtype == at::kBool) {
      t = at::randint(0, 2, in.shape, gen, torch::TensorOptions().dtype(at::kLong)).to(at::kBool);
    } else if (c10::isIntegralType(dtype, false)) {
      double high = in.high > in.low ? in.high : in.low + 2;
      t = at::randint(static_cast<int64_t>(in.low), static_cast<int64_t>(high), in.shape, gen, options);
    } else if (in.high > in.low) {
      t = at::rand(in.shape, gen, torch::TensorOptions().dtype(at::kFloat)).mul(in.high - in.low).add(in.low).to(dtype);
    } else {
      t = at::randn(in.shape, gen, torch::TensorOptions().dtype(at::kFloat)).to(dtype);
    }
    inputs.emplace_back(t);
  }
  return inputs;
}

namespace {

// Throws SpecError unless the spec's example_inputs, one per argument, run
// through forward. `constants`: the arguments already baked in, for the message.
void checkExampleInputs(const torch::jit::Module& model, const partitioner::SplitSpec& spec,
                        const std::map<std::string, std::string>& constants) {
  if (spec.example_inputs.empty()) return;
  auto method = model.get_method("forward");
  size_t expected = method.function().getSchema().arguments().size() - 1;
  if (spec.example_inputs.size() != expected) {
    std::vector<std::string> baked;
    for (const auto& [name, value] : constants) baked.push_back(name);
    const std::string besides = baked.empty() ? "" : fmt::format(" besides the constants ({})", fmt::join(baked, ", "));
    throw SpecError(fmt::format("example_inputs has {} entries but forward takes {} arguments{}; give one per argument",
                                spec.example_inputs.size(), expected, besides));
  }
  try {
    torch::NoGradGuard no_grad;
    auto copy = model.clone();
    copy.eval();
    copy.forward(makeExampleInputs(spec));
  } catch (const std::exception& e) {
    const std::string summary = errorSummary(e.what());
    if (summary.find("index out of range") != std::string::npos) {
      if (auto hint = embeddingRangeHint(model, spec)) {
        throw SpecError("example_inputs do not fit the model: forward failed with: " + summary + "; " + *hint);
      }
    }
    throw SpecError("example_inputs do not fit the model: forward failed with: " + summary +
                    "; fix their shape or dtype");
  }
}

}  // namespace

SplitResult splitInMemory(const torch::jit::Module& given_model, const partitioner::SplitSpec& spec) {
  // Note [Constant inputs]: from here on, forward takes no non-tensor argument.
  std::map<std::string, std::string> constants;
  const torch::jit::Module model = bakeConstantInputs(given_model, spec.constant_inputs, constants);
  checkExampleInputs(model, spec, constants);

  partitioner::ChosenPartition best = partitioner::searchPartition(
      model, spec, [&](const frontend::OpenedModel& opened, const frontend::ModelDag& dag,
                       const std::vector<size_t>& unit_starts) {
        return measureUnitCosts(opened, dag, spec, unit_starts);
      });
  BuiltStages stages = buildStages(best.opened, best.dag, best.partition);
  stages.manifest.constant_inputs = std::move(constants);
  stages.manifest.input_embeddings = inputEmbeddings(model);
  recordValueMeta(stages, spec);
  return SplitResult{std::move(best.opened), std::move(best.dag), std::move(best.partition), std::move(stages)};
}

SplitResult splitAtCalls(const torch::jit::Module& given_model, const partitioner::SplitSpec& spec, int open_depth) {
  PIPEFORGE_CHECK(open_depth >= 0, "splitAtCalls: open_depth " + std::to_string(open_depth) + " < 0");
  std::map<std::string, std::string> constants;
  const torch::jit::Module model = bakeConstantInputs(given_model, spec.constant_inputs, constants);
  checkExampleInputs(model, spec, constants);
  frontend::OpenOptions options;
  options.open_depth = open_depth;
  frontend::OpenedModel opened(model, options);
  frontend::ModelDag dag = frontend::buildDag(opened);
  partitioner::Partition partition = partitioner::partitionAtStarts(dag, partitioner::policyUnits(dag).starts);
  BuiltStages stages = buildStages(opened, dag, partition);
  stages.manifest.constant_inputs = std::move(constants);
  stages.manifest.input_embeddings = inputEmbeddings(model);
  recordValueMeta(stages, spec);
  return SplitResult{std::move(opened), std::move(dag), std::move(partition), std::move(stages)};
}

}  // namespace pipeforge::stage
