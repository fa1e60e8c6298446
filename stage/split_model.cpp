#include "stage/split_model.h"

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <optional>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/xxh3.h"
#include "frontend/load_model.h"
#include "frontend/module_mode.h"
#include "frontend/pipe_split_op.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_module_tree.h"
#include "frontend/pt2_import.h"
#include "frontend/pt2_inputs.h"
#include "partitioner/split_spec.h"
#include "stage/constant_inputs.h"
#include "stage/file_digest.h"
#include "stage/pt2_stage_plan.h"
#include "stage/pt2_stage_writer.h"
#include "stage/run_chained.h"
#include "stage/value_meta.h"
#include "stage/split_in_memory.h"

namespace pipeforge::stage {

namespace fs = std::filesystem;

namespace {

// The dtypes and shapes of the inputs and of what crosses each cut, as a
// TorchScript split records them (recordValueMeta): the spec's example inputs
// run through the `.pt2` stage files just written in `dir`, chained, each
// stage as its import, the way a rank runs it.
void recordPt2ValueMeta(const std::string& dir, const partitioner::SplitSpec& spec, PipeManifest& manifest) {
  if (spec.example_inputs.empty()) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::jit::Module> stages;
  for (const StageInfo& info : manifest.stages) {
    stages.push_back(frontend::loadPt2Model((fs::path(dir) / info.file).string()));
    stages.back().eval();
  }
  const std::vector<c10::IValue> inputs = makeExampleInputs(spec);
  std::vector<std::vector<at::Tensor>> outs;
  runChained(stages, manifest, inputs, nullptr, &outs);
  manifest.input_meta.clear();
  for (const auto& in : inputs) manifest.input_meta.push_back(tensorMeta(in.toTensor()));
  for (size_t k = 0; k < outs.size() && k < manifest.stages.size(); ++k) {
    manifest.stages[k].output_meta.clear();
    for (const auto& t : outs[k]) manifest.stages[k].output_meta.push_back(tensorMeta(t));
  }
}

}  // namespace

SplitSummary splitModelToDirectory(const SplitRequest& request) {
  fs::path out = fs::absolute(request.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  std::error_code ec;
  if (fs::exists(out, ec) && !request.force) {
    throw Error(ErrorCode::kUserInput,
                "output folder '" + request.out_dir + "' already exists; pass --force to replace it");
  }
  if (!out.parent_path().empty()) {
    fs::create_directories(out.parent_path(), ec);
    if (ec) {
      throw Error(ErrorCode::kIo,
                  "cannot create the parent of output folder '" + request.out_dir + "': " + ec.message());
    }
  }
  PIPEFORGE_CHECK(!(request.spec_path && request.spec), "SplitRequest: give spec_path or spec, not both");
  partitioner::SplitSpec spec = request.spec.value_or(partitioner::SplitSpec{});
  if (request.spec_path) spec = partitioner::loadSplitSpec(*request.spec_path);
  refuseConstantInputsForPt2(spec, request.model_path);

  // A torch.export model is split as its import and written as `.pt2`
  // stage files cut from its own program (Note [PT2 stage files]).
  std::optional<frontend::Pt2Archive> archive;
  const bool is_pt2 = frontend::detectArchiveKind(request.model_path) == frontend::ArchiveKind::kPt2 &&
                      fs::is_regular_file(request.model_path, ec);
  if (!request.weights.empty() && !is_pt2) {
    throw Error(ErrorCode::kUserInput,
                fmt::format("--weights fills a torch.export program (.pt2) by FQN, and '{}' is not one (a TorchScript "
                            "file carries its own weights); export the model with torch.export.save, or split without "
                            "--weights",
                            request.model_path));
  }
  if (is_pt2) {
    frontend::ensurePipeSplitRegistered();
    frontend::Pt2OpenOptions options;
    options.weights = request.weights;
    options.accept_unused_weights = request.accept_unused_weights;
    archive.emplace(frontend::Pt2Archive::open(request.model_path, options));
  }
  torch::jit::Module model = archive ? frontend::importPt2(*archive) : frontend::loadModel(request.model_path);
  // The split runs the model only on example inputs; without them a value
  // in a checkpoint's other dtype is converted only as it is written.
  if (archive && !spec.example_inputs.empty()) frontend::fillConvertedWeights(*archive, model);
  // Note [Ops that follow the mode]: what a stage cannot switch to eval mode.
  for (const std::string& op : frontend::randomOpsIgnoringMode(model)) {
    std::cerr << fmt::format("warning: {} draws random numbers in training and evaluation alike; held-out losses, "
                             "eval and generate include them (Pipeforge switches only dropout and batch norm to "
                             "eval mode)\n",
                             op);
  }
  SplitResult result = splitInMemory(model, spec);
  std::optional<Pt2SplitPlan> pt2;
  if (archive) {
    pt2 = planPt2Stages(*archive, result.dag, result.partition);
    pt2->manifest.input_embeddings = std::move(result.stages.manifest.input_embeddings);
    result.stages.manifest = std::move(pt2->manifest);
    // The sizes the export accepts travel in pipe.json, so that training can
    // refuse a microbatch a static export cannot take before any rank starts.
    std::vector<std::vector<InputDim>> input_dims;
    std::vector<std::string> input_dtypes;
    for (const auto& input : frontend::pt2UserInputs(*archive)) {
      std::vector<InputDim> dims;
      for (const auto& d : input.dims) dims.push_back({d.min, d.max});
      input_dims.push_back(std::move(dims));
      input_dtypes.push_back(input.dtype);
    }
    if (input_dims.size() == result.stages.manifest.inputs.size()) {
      result.stages.manifest.input_dims = input_dims;
      result.stages.manifest.input_dtypes = input_dtypes;
    }
  }
  PipeManifest& manifest = result.stages.manifest;
  if (std::all_of(manifest.input_dtypes.begin(), manifest.input_dtypes.end(),
                  [](const std::string& d) { return d.empty(); })) {
    manifest.input_dtypes.clear();
  }
  manifest.source = request.model_path;

  AtomicDirectory temp(out.string());  // Note [Atomic writes]
  for (size_t i = 0; i < manifest.stages.size(); ++i) {
    StageInfo& info = manifest.stages[i];
    const std::string file = (fs::path(temp.tempPath()) / info.file).string();
    if (pt2) {
      info.xxh3 = writePt2Stage(*archive, pt2->stages[i], file);  // Note [File digests], hashed as written
      continue;
    }
    try {
      result.stages.modules[i].save(file);
    } catch (const c10::Error& e) {  // the module was built and checked: only the write can fail
      throw Error(ErrorCode::kIo, "cannot write stage file '" + file + "': " + e.what_without_backtrace());
    }
    info.xxh3 = xxh3OfFile(file);  // Note [File digests]
  }
  if (pt2) recordPt2ValueMeta(temp.tempPath(), spec, manifest);
  writeFileAtomically((fs::path(temp.tempPath()) / kManifestFileName).string(), manifestToJson(manifest));
  temp.commit();
  return SplitSummary{std::move(result.stages.manifest), std::move(result.partition.balance)};
}

}  // namespace pipeforge::stage
