#include "tools/export_model.h"

#include <unistd.h>

#include <torch/script.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_weights.h"
#include "common/atomic_file.h"
#include "frontend/load_model.h"
#include "frontend/pipe_split_op.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_import.h"
#include "frontend/pt2_rewrite.h"

namespace pipeforge::train {
namespace {

namespace fs = std::filesystem;

using Found = CheckpointTensor;

// Returns false for a name the split recorded as unused, which keeps the
// model's value.
bool copyInto(const std::string& kind, const std::string& name, at::Tensor& target,
              const std::map<std::string, Found>& values, const std::string& dir,
              const std::set<std::string>& unused) {
  auto it = values.find(name);
  if (it == values.end() && unused.count(name)) return false;
  if (it == values.end()) {
    throw CheckpointError(fmt::format("the model's {} '{}' is not in checkpoint '{}'; was it trained from this model?",
                                      kind, name, dir));
  }
  const at::Tensor& value = it->second.tensor;
  if (!target.sizes().equals(value.sizes()) || target.scalar_type() != value.scalar_type()) {
    throw CheckpointError(fmt::format("{} '{}': the model has {} {} but the checkpoint {} {}", kind, name,
                                      c10::toString(target.scalar_type()), c10::str(target.sizes()),
                                      c10::toString(value.scalar_type()), c10::str(value.sizes())));
  }
  target.copy_(value);
  return true;
}

// Names of one tied group are one tensor in the model: their stage copies
// must agree, or copying them in turn would keep whichever came last. A tied
// name that no stage held under that name is the held one's tensor. Returns
// the number of groups.
int reconcileTiedCopies(const CheckpointMeta& meta, const std::string& dir, std::map<std::string, Found>& params) {
  int groups = 0;
  for (const auto& group : meta.tied) {
    const Found* first = nullptr;
    for (const auto& name : group) {
      auto it = params.find(name);
      if (it == params.end()) continue;
      if (first == nullptr) {
        first = &it->second;
        continue;
      }
      if (!first->tensor.equal(it->second.tensor)) {
        throw CheckpointError(fmt::format("tied parameters '{}' (stage {}) and '{}' (stage {}) differ in '{}'; tied "
                                          "copies must stay equal (a bug in the run that wrote it)",
                                          group.front(), first->stage, name, it->second.stage, dir));
      }
    }
    ++groups;
  }
  for (const auto& group : meta.tied) {
    auto held = std::find_if(group.begin(), group.end(), [&](const std::string& n) { return params.count(n) > 0; });
    if (held == group.end()) continue;
    for (const auto& name : group) {
      if (!params.count(name)) params.emplace(name, params.at(*held));
    }
  }
  return groups;
}

// Copies the checkpoint's tensors into `model` by name, counting them in
// `summary`; every checkpoint tensor must land in the model.
void copyCheckpointInto(torch::jit::Module& model, const std::map<std::string, Found>& params,
                        const std::map<std::string, Found>& buffers, const CheckpointMeta& meta,
                        const ExportRequest& request, ExportSummary& summary) {
  std::map<std::string, bool> used;
  const std::set<std::string> unused(meta.unused.begin(), meta.unused.end());
  {
    torch::NoGradGuard no_grad;
    for (const auto& p : model.named_parameters(/*recurse=*/true)) {
      at::Tensor target = p.value;
      used[p.name] = true;
      if (!copyInto("parameter", p.name, target, params, summary.checkpoint_dir, unused)) {
        summary.kept_unused.push_back(p.name);
        continue;
      }
      ++summary.parameters;
    }
    for (const auto& b : model.named_buffers(/*recurse=*/true)) {
      at::Tensor target = b.value;
      used[b.name] = true;
      if (!copyInto("buffer", b.name, target, buffers, summary.checkpoint_dir, unused)) {
        summary.kept_unused.push_back(b.name);
        continue;
      }
      ++summary.buffers;
    }
  }
  for (const auto* values : {&params, &buffers}) {
    for (const auto& [name, found] : *values) {
      if (!used.count(name)) {
        throw CheckpointError(fmt::format("checkpoint '{}' holds '{}' (stage {}), which model '{}' lacks; export "
                                          "with the model the run was split from ({})",
                                          summary.checkpoint_dir, name, found.stage, request.model_path, meta.source));
      }
    }
  }
}

}  // namespace

ExportSummary exportTrainedModel(const ExportRequest& request) {
  if (request.format == "safetensors") return exportSafetensors(request);
  if (!request.format.empty()) {
    throw CheckpointError(fmt::format("--format '{}' is not one pipeforge export writes; use --format safetensors, or "
                                      "leave it out to write by --out's extension (.pt, .pt2)",
                                      request.format));
  }
  std::error_code ec;
  // Only the formats written below: a name asking for another one is refused
  // before anything is read, not written in the wrong format under it.
  const std::string extension = fs::path(request.out_path).extension().string();
  const bool folder = !request.out_path.empty() && request.out_path.back() == '/';
  if (folder || fs::is_directory(request.out_path, ec) || (extension != ".pt" && extension != ".pt2")) {
    const std::string what = folder || fs::is_directory(request.out_path, ec) ? "a folder"
                             : extension.empty()                             ? "a file name without an extension"
                                                                             : "a '" + extension + "' file";
    throw CheckpointError(fmt::format(
        "--out '{}' names {}, a format pipeforge export does not write; it writes TorchScript (--out NAME.pt, loads "
        "with torch.jit.load) and, from a torch.export model, a torch.export archive (--out NAME.pt2, loads with "
        "torch.export.load); for safetensors (a save_pretrained folder), pass --format safetensors with --out DIR",
        request.out_path, what));
  }
  if (fs::exists(request.out_path, ec) && !request.force) {
    throw CheckpointError(fmt::format("'{}' already exists; pass --force to replace it", request.out_path));
  }
  ExportSummary summary;
  summary.checkpoint_dir = resolveCheckpoint(request.checkpoint);
  verifyCheckpoint(summary.checkpoint_dir);
  CheckpointMeta meta = readCheckpointMeta(summary.checkpoint_dir);
  summary.step = meta.step;
  auto params = readCheckpointTensors(summary.checkpoint_dir, meta.num_stages, /*parameters=*/true);
  auto buffers = readCheckpointTensors(summary.checkpoint_dir, meta.num_stages, /*parameters=*/false);

  summary.tied_groups = reconcileTiedCopies(meta, summary.checkpoint_dir, params);
  // A .pt2 written out is the original archive with new weights: open it
  // once, import the model from it, and rewrite that same archive below.
  const bool to_pt2 = fs::path(request.out_path).extension() == ".pt2";
  std::optional<frontend::Pt2Archive> archive;
  if (fs::is_regular_file(request.model_path, ec) &&
      frontend::detectArchiveKind(request.model_path) == frontend::ArchiveKind::kPt2) {
    frontend::ensurePipeSplitRegistered();
    frontend::Pt2OpenOptions names_only;
    names_only.need_values = false;
    archive.emplace(frontend::Pt2Archive::open(request.model_path, names_only));
    const auto& tensors = archive->tensors();
    if (std::any_of(tensors.begin(), tensors.end(), [](const frontend::Pt2TensorEntry& e) { return e.on_meta; })) {
      throw CheckpointError(fmt::format("model '{}' was exported on the meta device, so it cannot carry weights as a "
                                        "{}; write the trained weights as safetensors instead: --format safetensors "
                                        "--out DIR (add --like PRETRAINED_DIR for its config and tokenizer)",
                                        request.model_path, to_pt2 ? ".pt2" : "TorchScript .pt"));
    }
  }
  torch::jit::Module model = archive ? frontend::importPt2(*archive) : frontend::loadModel(request.model_path);
  copyCheckpointInto(model, params, buffers, meta, request, summary);

  if (to_pt2) {
    // The original archive with the trained weights: torch.export.load runs it.
    if (!archive) {
      throw CheckpointError(fmt::format("--out '{}' asks for a .pt2, but model '{}' is not a torch.export archive; "
                                        "a TorchScript model exports as .pt",
                                        request.out_path, request.model_path));
    }
    std::map<std::string, at::Tensor> trained;
    for (const auto& p : model.named_parameters(/*recurse=*/true)) trained.emplace(p.name, p.value);
    for (const auto& b : model.named_buffers(/*recurse=*/true)) trained.emplace(b.name, b.value);
    frontend::writePt2WithWeights(*archive, request.out_path, trained);
    return summary;
  }
  AtomicFile file(request.out_path);  // Note [Atomic writes]
  try {
    model.save(file.tempPath());
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("cannot write '{}': {}", request.out_path, e.what_without_backtrace()),
                          ErrorCode::kIo);
  }
  file.commit();
  return summary;
}

}  // namespace pipeforge::train
