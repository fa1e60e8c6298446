#include "tensor_parallel/stage_examples.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "frontend/pt2_archive.h"
#include "frontend/pt2_inputs.h"
#include "stage/manifest.h"
#include "stage/value_meta.h"
#include "tensor_parallel/tp_plan.h"

namespace pipeforge::tensor_parallel {
namespace {

std::optional<at::ScalarType> scalarType(const std::string& name) {
  static const std::map<std::string, at::ScalarType> types = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  auto it = types.find(name);
  if (it == types.end()) return std::nullopt;
  return it->second;
}

}  // namespace

std::vector<at::Tensor> stageExampleInputs(const std::string& split_dir, const stage::PipeManifest& manifest, int stage,
                                           const std::string& device) {
  const stage::StageInfo& info = manifest.stages.at(stage);
  std::vector<at::Tensor> out;
  if (std::filesystem::path(info.file).extension() == ".pt2") {
    const std::string path = (std::filesystem::path(split_dir) / info.file).string();
    const frontend::Pt2Archive archive = frontend::Pt2Archive::open(path);
    for (const frontend::Pt2UserInput& in : frontend::pt2UserInputs(archive)) {
      const std::optional<at::ScalarType> type = scalarType(in.dtype);
      const bool known = std::none_of(in.example.begin(), in.example.end(), [](std::int64_t n) { return n < 0; });
      if (!type || !known) {
        throw TpPlanError(fmt::format("tensor parallel plans each stage on one forward of inputs shaped as the "
                                      "export saw them, and '{}' records no {} for its input '{}'; re-export the "
                                      "model with torch.export",
                                      path, type ? "example size" : "dtype Pipeforge reads", in.name));
      }
      out.push_back(at::zeros(in.example, at::TensorOptions().dtype(*type).device(device)));
    }
    return out;
  }
  for (std::size_t i = 0; i < info.inputs.size(); ++i) {
    const stage::ValueSource& src = info.inputs[i];
    std::string recorded;
    if (src.kind == stage::ValueSource::Kind::kInput) {
      if (src.index < static_cast<int>(manifest.input_meta.size())) recorded = manifest.input_meta[src.index];
    } else {
      const auto& from = manifest.stages.at(src.stage);
      if (src.index < static_cast<int>(from.output_meta.size())) recorded = from.output_meta[src.index];
    }
    const std::optional<stage::ValueMeta> meta = stage::parseValueMeta(recorded);
    const std::optional<at::ScalarType> type = meta ? scalarType(meta->dtype) : std::nullopt;
    if (!type) {
      throw TpPlanError(fmt::format(
          "tensor parallel plans each stage on one forward of inputs shaped as the split saw them, and pipe.json "
          "records no dtype and shape for its input {}{}; give the split example inputs (model.example_inputs in a "
          "training config, example_inputs in a split spec)",
          i, recorded.empty() ? "" : " ('" + recorded + "')"));
    }
    out.push_back(at::zeros(meta->shape, at::TensorOptions().dtype(*type).device(device)));
  }
  return out;
}

}  // namespace pipeforge::tensor_parallel
