// loadModel: refusals name the problem and the fix.
#include <gtest/gtest.h>

#include <torch/script.h>

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
  EXPECT_NE(refusal(text).find("torch.jit.script(model).save(path)"), std::string::npos) << refusal(text);
  std::filesystem::remove(text);
}

}  // namespace
}  // namespace pipeforge::frontend
