// Fuzzes the `.pt2` reader and importer (frontend/pt2_archive.h, pt2_import.h):
// the input is the models/model.json (the ExportedProgram JSON) of an otherwise
// valid archive; Pt2Archive::open then importPt2 either succeed or throw the
// documented Pt2Error / ModelError.
//
// The rest of the archive -- archive_format, archive_version, byteorder, the
// weights and constants configs and payloads -- comes from fuzz/data/pt2_json_base.pt2,
// which fuzz/make_pt2_json_seeds.py writes together with the seeds: one tiny
// model exported several ways, so every seed finds its tensors there.
// Each input is written as a fresh archive to one scratch file per process
// (under /dev/shm when it exists), because the reader takes a path.
#include <caffe2/serialize/inline_container.h>
#include <torch/script.h>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "frontend/load_model.h"
#include "frontend/pt2_archive.h"
#include "frontend/pt2_import.h"
#include "fuzz/fuzz_support.h"

#ifndef PIPEFORGE_FUZZ_PT2_BASE
#error "PIPEFORGE_FUZZ_PT2_BASE must name fuzz/data/pt2_json_base.pt2 (fuzz/CMakeLists.txt sets it)"
#endif

namespace {

using pipeforge::frontend::ModelError;
constexpr const char* kTarget = "pt2_json";
constexpr const char* kModelRecord = "models/model.json";

// The base archive's records (all but the model JSON), read once, and where
// this process writes its archives.
struct Base {
  std::vector<std::pair<std::string, std::string>> records;
  std::string scratch;
};

Base& base() {
  static Base b;
  return b;
}

void removeScratch() {
  if (!base().scratch.empty()) std::remove(base().scratch.c_str());
}

void loadBase() {
  const char* path = std::getenv("PIPEFORGE_FUZZ_PT2_BASE");
  if (path == nullptr) path = PIPEFORGE_FUZZ_PT2_BASE;
  try {
    caffe2::serialize::PyTorchStreamReader reader{std::string(path)};
    for (const auto& name : reader.getAllRecords()) {
      if (name.rfind("models/", 0) == 0) continue;
      auto [data, size] = reader.getRecord(name);
      base().records.emplace_back(name, std::string(static_cast<const char*>(data.get()), size));
    }
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "==pipeforge-fuzz== %s: cannot read the base archive %s: %s\n"
                 "  make it with: .venv/bin/python fuzz/make_pt2_json_seeds.py\n",
                 kTarget, path, e.what_without_backtrace());
    std::exit(2);
  }
  // The archive's root folder is named after the file: "model/...".
  namespace fs = std::filesystem;
  fs::path dir = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  dir /= "pt2fuzz-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  base().scratch = (dir / "model.pt2").string();
  std::atexit([] {
    removeScratch();
    std::error_code ec;
    std::filesystem::remove(std::filesystem::path(base().scratch).parent_path(), ec);
  });
}

// The base archive with `model_json` as models/model.json, written the way
// torch.export.save writes (PyTorchStreamWriter adds .data/version and the
// serialization id).
void writeArchive(const std::string& model_json) {
  caffe2::serialize::PyTorchStreamWriter writer(base().scratch);
  writer.writeRecord(kModelRecord, model_json.data(), model_json.size());
  for (const auto& [name, data] : base().records) {
    if (writer.getAllWrittenRecords().count(name) == 0) writer.writeRecord(name, data.data(), data.size());
  }
  writer.writeEndOfFile();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  loadBase();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace pf = pipeforge;
  try {
    writeArchive(pf::fuzz::textOf(data, size));
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "==pipeforge-fuzz== %s: cannot write %s: %s\n", kTarget, base().scratch.c_str(),
                 e.what_without_backtrace());
    std::abort();
  }

  // Pt2Error is a ModelError: the type the CLI reports as one message.
  const char* step = "Pt2Archive::open";
  try {
    pf::frontend::Pt2Archive archive = pf::frontend::Pt2Archive::open(base().scratch);
    step = "importPt2";
    torch::jit::Module module = pf::frontend::importPt2(archive);
  } catch (const ModelError& e) {
    pf::fuzz::noteRejected(kTarget, e);
    return 0;
  } catch (...) {
    pf::fuzz::failOnUndocumentedException(kTarget, step);
  }
  pf::fuzz::noteAccepted(kTarget);
  return 0;
}
