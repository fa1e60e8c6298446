#include "runtime/comm_plan.h"

#include <string>

namespace pipeforge::runtime {
namespace {

using stage::ValueSource;

int addEdge(CommPlan& plan, const ValueSource& src, int consumer, int slot) {
  Edge e;
  e.id = static_cast<int>(plan.edges.size());
  e.producer = src.stage;
  e.producer_output = src.index;
  e.consumer = consumer;
  e.consumer_slot = slot;
  plan.edges.push_back(e);
  plan.stages[src.stage].consumers[src.index].push_back(e.id);
  return e.id;
}

}  // namespace

CommPlan buildCommPlan(const stage::PipeManifest& manifest) {
  CommPlan plan;
  plan.num_stages = manifest.num_stages;
  plan.num_model_inputs = static_cast<int>(manifest.inputs.size());
  plan.stages.resize(manifest.num_stages);
  for (int s = 0; s < manifest.num_stages; ++s) {
    plan.stages[s].num_outputs = manifest.stages[s].num_outputs;
    plan.stages[s].consumers.resize(manifest.stages[s].num_outputs);
  }
  // Edges in consumer order, then input order: ids are deterministic.
  for (int s = 0; s < manifest.num_stages; ++s) {
    StagePlan& sp = plan.stages[s];
    const auto& inputs = manifest.stages[s].inputs;
    sp.num_module_inputs = static_cast<int>(inputs.size());
    for (int slot = 0; slot < static_cast<int>(inputs.size()); ++slot) {
      const ValueSource& src = inputs[slot];
      StageInput in;
      if (src.kind == ValueSource::Kind::kInput) {
        in.kind = StageInput::Kind::kRoot;
        in.root_index = src.index;
      } else {
        in.kind = StageInput::Kind::kEdge;
        in.edge = addEdge(plan, src, s, slot);
      }
      sp.inputs.push_back(in);
    }
  }
  const int last = manifest.num_stages - 1;
  StagePlan& lp = plan.stages[last];
  for (const ValueSource& src : manifest.outputs) {
    ModelOutput out;
    if (src.kind == ValueSource::Kind::kInput) {
      out.kind = ModelOutput::Kind::kRoot;
      out.index = src.index;
    } else if (src.stage == last) {
      out.kind = ModelOutput::Kind::kOwn;
      out.index = src.index;
    } else {
      out.kind = ModelOutput::Kind::kLossInput;
      out.index = static_cast<int>(lp.inputs.size());
      StageInput in;
      in.kind = StageInput::Kind::kEdge;
      in.edge = addEdge(plan, src, last, out.index);
      lp.inputs.push_back(in);
    }
    plan.model_outputs.push_back(out);
  }
  if (plan.model_outputs.empty()) {
    throw stage::ManifestError("pipe.json lists no model outputs; the loss needs at least one");
  }
  return plan;
}

}  // namespace pipeforge::runtime
