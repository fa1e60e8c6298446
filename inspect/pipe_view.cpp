#include "inspect/pipe_view.h"

#include <torch/script.h>

#include <filesystem>

#include "common/error.h"
#include "frontend/load_model.h"
#include "partitioner/split_spec.h"
#include "stage/constant_inputs.h"
#include "stage/split_in_memory.h"

namespace pipeforge::inspect {

PipeView::PipeView() = default;
PipeView::~PipeView() = default;
PipeView::PipeView(PipeView&&) noexcept = default;
PipeView& PipeView::operator=(PipeView&&) noexcept = default;

PipeView loadPipeView(const std::string& path, const std::optional<std::string>& spec_path) {
  PipeView view;
  if (std::filesystem::is_directory(path)) {
    if (spec_path) {
      throw Error(ErrorCode::kUserInput, "--spec applies to a model file; '" + path + "' is a split folder");
    }
    view.manifest = stage::readManifest(path);
    for (const auto& s : view.manifest.stages) {
      view.stages.push_back(frontend::loadModel((std::filesystem::path(path) / s.file).string()));
    }
    return view;
  }
  torch::jit::Module model = frontend::loadModel(path);
  if (spec_path) {
    const partitioner::SplitSpec spec = partitioner::loadSplitSpec(*spec_path);
    stage::refuseConstantInputsForPt2(spec, path);
    auto result = stage::splitInMemory(model, spec);
    view.stages = std::move(result.stages.modules);
    view.manifest = std::move(result.stages.manifest);
    view.manifest.source = path;
    view.balance = result.partition.balance;
    return view;
  }
  // The whole model as one stage.
  view.stages.push_back(model);
  auto& m = view.manifest;
  m.num_stages = 1;
  m.source = path;
  const auto& args = model.get_method("forward").function().getSchema().arguments();
  stage::StageInfo info;
  info.file = path;
  for (size_t i = 1; i < args.size(); ++i) {
    m.inputs.push_back(args[i].name());
    info.inputs.push_back({stage::ValueSource::Kind::kInput, -1, static_cast<int>(i - 1)});
  }
  const auto& returns = model.get_method("forward").function().getSchema().returns();
  auto tuple = returns.size() == 1 ? returns[0].type()->cast<c10::TupleType>() : nullptr;
  info.num_outputs = tuple ? static_cast<int>(tuple->elements().size()) : static_cast<int>(returns.size());
  for (int i = 0; i < info.num_outputs; ++i) m.outputs.push_back({stage::ValueSource::Kind::kStage, 0, i});
  for (const auto& p : model.named_parameters(true)) info.parameters.push_back(p.name);
  for (const auto& b : model.named_buffers(true)) info.buffers.push_back(b.name);
  m.stages.push_back(info);
  return view;
}

}  // namespace pipeforge::inspect
