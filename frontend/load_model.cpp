#include "frontend/load_model.h"

#include <torch/script.h>

#include <cstdint>
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

// A safetensors file: an 8-byte little-endian header length, then its JSON header.
bool looksLikeSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char head[9] = {};
  in.read(reinterpret_cast<char*>(head), 9);
  if (in.gcount() != 9 || head[8] != '{') return false;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
  return n >= 2 && n < (std::uint64_t{1} << 32);
}

// What save_pretrained writes: config.json beside the weights.
bool looksLikeTransformersFolder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"}) {
    if (fs::exists(fs::path(path) / name, ec)) return true;
  }
  return false;
}

// How to make what Pipeforge splits; the README's main path first.
constexpr const char* kExportHow =
    "torch.export.save(torch.export.export(model, (example_input,)), 'model.pt2') (see the README's \"Stock "
    "transformers models\"), or as TorchScript, torch.jit.script(model).save('model.pt')";

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
    if (looksLikeTransformersFolder(path)) {
      throw ModelError("'" + path +
                       "' is a transformers checkpoint folder (save_pretrained), which holds weights and a config but "
                       "no program to split; in Python, load it and export the model with its weights: model = "
                       "AutoModelForCausalLM.from_pretrained('" + path +
                       "', use_cache=False).train(); " + kExportHow + "; then give the .pt2");
    }
    throw ModelError("'" + path + "' is a directory, not a model file; give the .pt2 written by " + kExportHow);
  }
  if (looksLikeSafetensors(path)) {
    throw ModelError("'" + path +
                     "' is a safetensors weights file, which holds no program to split; in Python, load the weights "
                     "into the model (from_pretrained on their folder, or load_state_dict) and export it: " +
                     kExportHow + "; then give the .pt2");
  }
  // PT2 hook (issue 10): torch.export archives, recognised by content, go
  // through the PT2 importer, which rebuilds them as a TorchScript module.
  if (detectArchiveKind(path) != ArchiveKind::kTorchScript) return loadPt2Model(path);
  if (!looksLikeZip(path)) {
    throw ModelError("'" + path +
                     "' is neither a torch.export archive (.pt2) nor a TorchScript archive (no zip header); save the "
                     "model with " + kExportHow);
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
