// Which values travel between stages, derived from pipe.json alone.
//
// Note [Communication plan]
// The runtime moves values along *edges*, one per (producer output, consumer
// input) pair named in pipe.json, never along "stage s to stage s+1" only:
//  * a stage output read by stage k travels directly producer -> k, even when
//    k is two or more stages later (a skip); its gradient comes back along the
//    same edge, and a producer sums the gradients of all its consumers;
//  * model outputs made by a stage other than the last travel to the last
//    stage, where the loss is computed, as extra *loss inputs* appended after
//    the last stage's module inputs (and get their gradients back the same way);
//  * root inputs (the model's forward arguments) are never sent: every rank
//    has the global batch (Note [Batch on every rank]) and cuts a stage's root
//    inputs from it on the rank that holds that stage;
//  * each edge has its own id; tags are derived from (edge, microbatch, kind),
//    so messages on different edges between the same two ranks never mix.
// Whether an edge crosses ranks is decided later, from the stage -> rank map.
#pragma once

#include <vector>

#include "stage/manifest.h"

namespace pipeforge::runtime {

struct StageInput {
  enum class Kind { kRoot, kEdge };
  Kind kind = Kind::kRoot;
  int root_index = -1;  // kRoot: which model input
  int edge = -1;        // kEdge: which edge (index into CommPlan::edges)
};

struct Edge {
  int id = 0;
  int producer = 0;         // stage
  int producer_output = 0;  // index into the producer's outputs
  int consumer = 0;         // stage
  int consumer_slot = 0;    // index into the consumer's StagePlan::inputs
};

// Where model output k comes from, seen from the last stage.
struct ModelOutput {
  enum class Kind { kOwn, kLossInput, kRoot };
  Kind kind = Kind::kOwn;
  int index = 0;  // kOwn: last stage output; kLossInput: slot in StagePlan::inputs; kRoot: model input
};

struct StagePlan {
  // The module's inputs in pipe.json order, then (last stage only) the loss inputs.
  std::vector<StageInput> inputs;
  int num_module_inputs = 0;
  int num_outputs = 0;
  std::vector<std::vector<int>> consumers;  // per output: the edges that carry it
};

struct CommPlan {
  int num_stages = 0;
  int num_model_inputs = 0;
  std::vector<StagePlan> stages;
  std::vector<Edge> edges;
  std::vector<ModelOutput> model_outputs;  // read on the last stage
};

// Builds the plan; throws stage::ManifestError when a model output or stage
// input names something that does not exist (readManifest checks most of it).
CommPlan buildCommPlan(const stage::PipeManifest& manifest);

}  // namespace pipeforge::runtime
