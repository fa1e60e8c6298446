#include "stage/split_model.h"

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "common/atomic_file.h"
#include "common/error.h"
#include "frontend/load_model.h"
#include "frontend/pipe_split_op.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_import.h"
#include "frontend/pt2_inputs.h"
#include "partitioner/split_spec.h"
#include "stage/constant_inputs.h"
#include "stage/file_digest.h"
#include "stage/pt2_stage_plan.h"
#include "stage/pt2_stage_writer.h"
#include "stage/split_in_memory.h"

namespace pipeforge::stage {

namespace fs = std::filesystem;

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
  if (frontend::detectArchiveKind(request.model_path) == frontend::ArchiveKind::kPt2 &&
      fs::is_regular_file(request.model_path, ec)) {
    frontend::ensurePipeSplitRegistered();
    archive.emplace(frontend::Pt2Archive::open(request.model_path));
  }
  torch::jit::Module model = archive ? frontend::importPt2(*archive) : frontend::loadModel(request.model_path);
  SplitResult result = splitInMemory(model, spec);
  std::optional<Pt2SplitPlan> pt2;
  if (archive) {
    pt2 = planPt2Stages(*archive, result.dag, result.partition);
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
      writePt2Stage(*archive, pt2->stages[i], file);
    } else {
      try {
        result.stages.modules[i].save(file);
      } catch (const c10::Error& e) {  // the module was built and checked: only the write can fail
        throw Error(ErrorCode::kIo, "cannot write stage file '" + file + "': " + e.what_without_backtrace());
      }
    }
    info.sha256 = sha256OfFile(file);  // Note [File digests]
  }
  writeFileAtomically((fs::path(temp.tempPath()) / kManifestFileName).string(), manifestToJson(manifest));
  temp.commit();
  return SplitSummary{std::move(result.stages.manifest), std::move(result.partition.balance)};
}

}  // namespace pipeforge::stage
