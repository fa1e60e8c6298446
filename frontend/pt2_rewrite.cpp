#include "frontend/pt2_rewrite.h"

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <torch/script.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "common/atomic_file.h"
#include "frontend/pt2_archive.h"

namespace pipeforge::frontend {
namespace {

// Record name (relative to the archive root) -> the names whose tensor it holds.
std::map<std::string, std::vector<std::string>> payloadRecords(caffe2::serialize::PyTorchStreamReader& reader,
                                                               const std::string& model, const std::string& path) {
  std::map<std::string, std::vector<std::string>> records;
  for (const char* kind : {"weights", "constants"}) {
    const std::string folder = fmt::format("data/{}", kind);
    const std::string config_name = fmt::format("{}/{}_{}_config.json", folder, model, kind);
    if (!reader.hasRecord(config_name)) continue;
    auto [data, size] = reader.getRecord(config_name);
    nlohmann::json config = nlohmann::json::parse(std::string(static_cast<const char*>(data.get()), size), nullptr,
                              /*allow_exceptions=*/false);
    if (!config.is_object() || !config.contains("config") || !config.at("config").is_object()) {
      throw Pt2Error(fmt::format("'{}': {} is malformed; re-save the model with torch.export.save", path,
                                 config_name));
    }
    for (const auto& [fqn, payload] : config.at("config").items()) {
      if (!payload.is_object() || !payload.contains("path_name") || !payload.at("path_name").is_string()) {
        throw Pt2Error(fmt::format("'{}': {} gives '{}' no path_name; re-save the model with torch.export.save",
                                   path, config_name, fqn));
      }
      records[folder + "/" + payload.at("path_name").get<std::string>()].push_back(fqn);
    }
  }
  return records;
}

}  // namespace

void writePt2WithWeights(Pt2Archive& archive, const std::string& out_path,
                         const std::map<std::string, at::Tensor>& values) {
  // The reader mapped every payload into one storage per record, shared by
  // all names viewing it (tied weights).
  const std::string& original = archive.path();
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, value] : values) {
      if (!archive.hasTensor(name)) {
        throw Pt2Error(fmt::format("'{}' holds no tensor '{}'; export with the model the run was split from",
                                   original, name));
      }
      at::Tensor target = archive.tensor(name);
      if (!target.sizes().equals(value.sizes()) || target.scalar_type() != value.scalar_type()) {
        throw Pt2Error(fmt::format("'{}': '{}' is {} {} in the archive but {} {} in the checkpoint", original, name,
                                   c10::toString(target.scalar_type()), c10::str(target.sizes()),
                                   c10::toString(value.scalar_type()), c10::str(value.sizes())));
      }
      target.copy_(value);
    }
    // Tied names view one storage; the last copy wins, so they must agree.
    for (const auto& [name, value] : values) {
      if (!archive.tensor(name).equal(value)) {
        throw Pt2Error(fmt::format("'{}' shares its storage in '{}' with another name given a different value; "
                                   "tied weights must be exported with one value",
                                   name, original));
      }
    }
  }

  caffe2::serialize::PyTorchStreamReader reader(original);
  const auto records = payloadRecords(reader, archive.modelName(), original);
  AtomicFile file(out_path);  // Note [Atomic writes]
  {
    std::ofstream out(file.tempPath(), std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Pt2Error(fmt::format("cannot write '{}'; check the folder exists and is writable", out_path),
                     ErrorCode::kIo);
    }
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) -> size_t {
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
      return out ? size : 0;
    });
    for (const std::string& name : reader.getAllRecords()) {
      // Written afresh at the end: it identifies this archive's content.
      if (name == ".data/serialization_id") continue;
      auto payload = records.find(name);
      const at::Tensor* tensor = nullptr;
      if (payload != records.end()) {
        for (const auto& fqn : payload->second) {
          if (values.count(fqn) && archive.tensor(fqn).storage().nbytes() > 0) tensor = &archive.tensor(fqn);
        }
      }
      if (tensor != nullptr) {
        const c10::Storage& storage = tensor->storage();
        writer.writeRecord(name, storage.data_ptr().get(), storage.nbytes());
      } else {
        auto [data, size] = reader.getRecord(name);
        writer.writeRecord(name, data.get(), size);
      }
    }
    writer.writeEndOfFile();
    out.close();
    if (!out) throw Pt2Error(fmt::format("cannot write '{}': the disk may be full", out_path), ErrorCode::kIo);
  }
  file.commit();
}

}  // namespace pipeforge::frontend
