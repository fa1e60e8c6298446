#include "stage/split_model.h"

#include <torch/script.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "frontend/load_model.h"
#include "partitioner/split_spec.h"
#include "stage/file_digest.h"
#include "stage/split_in_memory.h"

namespace pipeforge::stage {
namespace {

namespace fs = std::filesystem;

// A sibling folder that is removed unless released: a failed split leaves nothing behind.
class TempSibling {
 public:
  explicit TempSibling(const fs::path& target) {
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
      fs::path candidate = target.parent_path() / (target.filename().string() + ".tmp-" + std::to_string(rd() % 1000000));
      std::error_code ec;
      if (fs::create_directory(candidate, ec)) {
        path_ = candidate;
        return;
      }
    }
    throw std::runtime_error("cannot create a temporary folder beside '" + target.string() + "'");
  }
  ~TempSibling() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  const fs::path& path() const { return path_; }
  void release() { path_.clear(); }

 private:
  fs::path path_;
};

}  // namespace

SplitSummary splitModelToDirectory(const SplitRequest& request) {
  fs::path out = fs::absolute(request.out_dir).lexically_normal();
  if (out.filename().empty()) out = out.parent_path();
  std::error_code ec;
  if (fs::exists(out, ec) && !request.force) {
    throw std::runtime_error("output folder '" + request.out_dir + "' already exists; pass --force to replace it");
  }
  if (!out.parent_path().empty()) {
    fs::create_directories(out.parent_path(), ec);
    if (ec) {
      throw std::runtime_error("cannot create the parent of output folder '" + request.out_dir + "': " + ec.message());
    }
  }
  partitioner::SplitSpec spec;
  if (request.spec_path) spec = partitioner::loadSplitSpec(*request.spec_path);

  torch::jit::Module model = frontend::loadModel(request.model_path);
  SplitResult result = splitInMemory(model, spec);
  result.stages.manifest.source = request.model_path;

  TempSibling temp(out);
  for (size_t i = 0; i < result.stages.modules.size(); ++i) {
    StageInfo& info = result.stages.manifest.stages[i];
    const std::string file = (temp.path() / info.file).string();
    result.stages.modules[i].save(file);
    info.sha256 = sha256OfFile(file);  // Note [File digests]
  }
  {
    std::ofstream json(temp.path() / kManifestFileName);
    json << manifestToJson(result.stages.manifest);
    if (!json) throw std::runtime_error("cannot write " + (temp.path() / kManifestFileName).string());
  }
  if (fs::exists(out, ec)) {
    // Swap in the new folder first, then drop the old one.
    TempSibling old(out);
    fs::remove(old.path());
    fs::rename(out, old.path());
    fs::rename(temp.path(), out);
  } else {
    fs::rename(temp.path(), out);
  }
  temp.release();
  return SplitSummary{std::move(result.stages.manifest), std::move(result.partition.balance)};
}

}  // namespace pipeforge::stage
