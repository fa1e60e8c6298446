// loadModel: refusals name the problem and the fix.
#include <gtest/gtest.h>

#include <torch/script.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "frontend/load_model.h"

namespace pipeforge::frontend {
namespace {

std::string refusal(const std::string& path) {
  try {
    loadModel(path);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "<loaded>";
}

TEST(LoadModel, RefusesADirectory) {
  EXPECT_THROW(loadModel("/tmp"), ModelError);
}

TEST(LoadModel, RefusalsSayWhatToDo) {
  EXPECT_NE(refusal("/nonexistent/model.pt").find("does not exist; check the path"), std::string::npos);
  EXPECT_NE(refusal("/tmp").find("is a directory"), std::string::npos);
  const std::string text = (std::filesystem::temp_directory_path() / "pipeforge_not_a_model.pt").string();
  std::ofstream(text) << "not a zip";
  // The torch.export path first (the README's main one), TorchScript second.
  const std::string said = refusal(text);
  EXPECT_NE(said.find("neither a torch.export archive (.pt2) nor a TorchScript archive"), std::string::npos) << said;
  EXPECT_LT(said.find("torch.export.save("), said.find("torch.jit.script(model).save")) << said;
  std::filesystem::remove(text);
}

// Issue 39 item 9: weights without a program (a safetensors file, a
// save_pretrained folder) are named as such, with the export step that makes
// a program of them, not "save it with torch.jit.script".
TEST(LoadModel, WeightsAloneAreNamedWithTheExportStep) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "pipeforge_hf_folder";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << "{\"model_type\": \"llama\"}";
  // A real safetensors header: 8-byte little-endian length, then JSON.
  const std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  {
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << std::string(4, '\0');
  }
  const std::string folder = refusal(dir.string());
  EXPECT_NE(folder.find("is a transformers checkpoint folder (save_pretrained)"), std::string::npos) << folder;
  EXPECT_NE(folder.find("from_pretrained('" + dir.string() + "', use_cache=False)"), std::string::npos) << folder;
  EXPECT_NE(folder.find("torch.export.save(torch.export.export(model"), std::string::npos) << folder;
  EXPECT_EQ(folder.find("torch.jit.script"), folder.rfind("torch.jit.script")) << folder;  // once, last
  const std::string file = refusal((dir / "model.safetensors").string());
  EXPECT_NE(file.find("is a safetensors weights file, which holds no program to split"), std::string::npos) << file;
  EXPECT_NE(file.find("torch.export.save(torch.export.export(model"), std::string::npos) << file;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pipeforge::frontend
