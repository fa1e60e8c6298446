#include "frontend/load_model.h"

#include <torch/script.h>

#include <filesystem>
#include <fstream>

#include "frontend/pipe_split_op.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_import.h"

namespace pipeforge::frontend {
namespace {

// TorchScript archives are zip files; checking the magic first turns "this is
// a text file" into a clear message instead of a deep PyTorchStreamReader error.
bool looksLikeZip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}

std::string firstLine(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

}  // namespace

torch::jit::Module loadModel(const std::string& path) {
  ensurePipeSplitRegistered();
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw ModelError("model file '" + path + "' does not exist; check the path");
  }
  if (fs::is_directory(path, ec)) {
    throw ModelError("'" + path + "' is a directory, not a model file; pass the .pt file saved by torch.jit.save");
  }
  // PT2 hook (issue 10): torch.export archives, recognised by content, go
  // through the PT2 importer, which rebuilds them as a TorchScript module.
  if (detectArchiveKind(path) != ArchiveKind::kTorchScript) return loadPt2Model(path);
  if (!looksLikeZip(path)) {
    throw ModelError("'" + path +
                     "' is not a TorchScript archive (no zip header); save the model with "
                     "torch.jit.script(model).save(path) or torch.jit.trace(...).save(path)");
  }
  torch::jit::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw ModelError("cannot load TorchScript archive '" + path + "' (truncated or corrupt?): " +
                     firstLine(e.what_without_backtrace()) +
                     "; re-save the model with torch.jit.save");
  }
  if (!module.find_method("forward")) {
    throw ModelError("model '" + path + "' has no forward method; script the module whose forward you want to split");
  }
  return module;
}

}  // namespace pipeforge::frontend
