// The values of a pipe as inspect names and measures them: model inputs and
// stage outputs, their recorded dtype and shape, and which of them cross
// each stage boundary. Torch-free: it reads only the manifest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stage/manifest.h"

namespace pipeforge::inspect {

// The name the root dataflow gives a value: "x" (a model input), "stage_0"
// (a stage's only output), "stage_0_1" (output 1 of stage 0).
std::string valueName(const stage::PipeManifest& manifest, const stage::ValueSource& value);

// "float32[6, 8]" as the split recorded it (older splits: "Float[6, 8]");
// empty when it recorded none (no example_inputs in the spec).
std::string recordedMeta(const stage::PipeManifest& manifest, const stage::ValueSource& value);

// Bytes of the value's tensor, when its meta was recorded and its dtype's size is known.
std::optional<int64_t> recordedBytes(const stage::PipeManifest& manifest, const stage::ValueSource& value);

// "float32[6, 8] (192 B)"; empty when nothing was recorded.
std::string describeValue(const stage::PipeManifest& manifest, const stage::ValueSource& value);

// Every stage output that a later stage or the model's outputs read, once
// each, in value order (producing stage, then output index).
std::vector<stage::ValueSource> stageOutputsRead(const stage::PipeManifest& manifest);

// A stage output alive across a boundary: made by stage `from`, last read
// by stage `to` (num_stages when a model output).
struct CrossingValue {
  stage::ValueSource value;
  int to = 0;
};

// The stage outputs that cross the boundary between stage `after` and
// `after + 1`: made at or before `after`, read after it. In value order
// (producing stage, then output index).
//
//   stage 0 -> (a, b); stage 1 reads b; stage 2 reads a: boundary 0|1 is
//   crossed by a (0 -> 2) and b (0 -> 1), boundary 1|2 by a and stage 1's output.
std::vector<CrossingValue> valuesCrossing(const stage::PipeManifest& manifest, int after);

// The bytes of everything valuesCrossing(manifest, after) lists; nullopt when
// one of them has no recorded meta or a dtype of unknown size.
std::optional<int64_t> bytesCrossing(const stage::PipeManifest& manifest, int after);

}  // namespace pipeforge::inspect
