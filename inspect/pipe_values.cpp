#include "inspect/pipe_values.h"

#include <algorithm>

#include "stage/value_meta.h"

namespace pipeforge::inspect {
namespace {

using stage::ValueSource;

}  // namespace

std::string valueName(const stage::PipeManifest& manifest, const ValueSource& value) {
  if (value.kind == ValueSource::Kind::kInput) return manifest.inputs.at(value.index);
  if (manifest.stages.at(value.stage).num_outputs == 1) return "stage_" + std::to_string(value.stage);
  return "stage_" + std::to_string(value.stage) + "_" + std::to_string(value.index);
}

std::string recordedMeta(const stage::PipeManifest& manifest, const ValueSource& value) {
  const std::vector<std::string>& meta =
      value.kind == ValueSource::Kind::kInput ? manifest.input_meta : manifest.stages.at(value.stage).output_meta;
  if (value.index < 0 || value.index >= static_cast<int>(meta.size())) return "";
  return meta[value.index];
}

std::optional<int64_t> recordedBytes(const stage::PipeManifest& manifest, const ValueSource& value) {
  auto meta = stage::parseValueMeta(recordedMeta(manifest, value));
  if (!meta) return std::nullopt;
  return stage::valueBytes(*meta);
}

std::string describeValue(const stage::PipeManifest& manifest, const ValueSource& value) {
  const std::string meta = recordedMeta(manifest, value);
  return meta.empty() ? "" : stage::describeValueMeta(meta);
}

std::vector<ValueSource> stageOutputsRead(const stage::PipeManifest& manifest) {
  std::vector<ValueSource> values;
  auto add = [&](const ValueSource& v) {
    if (v.kind == ValueSource::Kind::kStage && std::find(values.begin(), values.end(), v) == values.end()) {
      values.push_back(v);
    }
  };
  for (const auto& s : manifest.stages) {
    for (const auto& in : s.inputs) add(in);
  }
  for (const auto& out : manifest.outputs) add(out);
  std::sort(values.begin(), values.end(), [](const ValueSource& a, const ValueSource& b) {
    return a.stage != b.stage ? a.stage < b.stage : a.index < b.index;
  });
  return values;
}

std::vector<CrossingValue> valuesCrossing(const stage::PipeManifest& manifest, int after) {
  // The last reader of every stage output: a later stage, or the model's outputs.
  std::vector<CrossingValue> crossing;
  auto note = [&](const ValueSource& v, int reader) {
    if (v.kind != ValueSource::Kind::kStage || v.stage > after || reader <= after) return;
    auto it = std::find_if(crossing.begin(), crossing.end(), [&](const CrossingValue& c) { return c.value == v; });
    if (it == crossing.end()) {
      crossing.push_back({v, reader});
    } else {
      it->to = std::max(it->to, reader);
    }
  };
  for (const auto& s : manifest.stages) {
    for (const auto& in : s.inputs) note(in, s.index);
  }
  for (const auto& out : manifest.outputs) note(out, manifest.num_stages);
  std::sort(crossing.begin(), crossing.end(), [](const CrossingValue& a, const CrossingValue& b) {
    return a.value.stage != b.value.stage ? a.value.stage < b.value.stage : a.value.index < b.value.index;
  });
  return crossing;
}

std::optional<int64_t> bytesCrossing(const stage::PipeManifest& manifest, int after) {
  int64_t total = 0;
  for (const CrossingValue& c : valuesCrossing(manifest, after)) {
    auto bytes = recordedBytes(manifest, c.value);
    if (!bytes) return std::nullopt;
    total += *bytes;
  }
  return total;
}

}  // namespace pipeforge::inspect
