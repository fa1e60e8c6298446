#include "inspect/dot_text.h"

#include "inspect/pipe_values.h"
#include "stage/value_meta.h"

namespace pipeforge::inspect {

std::string escapeDot(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string valueNodeId(const stage::ValueSource& value) {
  if (value.kind == stage::ValueSource::Kind::kInput) return "in_" + std::to_string(value.index);
  return "v_" + std::to_string(value.stage) + "_" + std::to_string(value.index);
}

std::string valueNodeLabel(const std::string& name, const stage::PipeManifest& manifest,
                           const stage::ValueSource& value) {
  std::string label = escapeDot(name);
  if (auto meta = stage::parseValueMeta(recordedMeta(manifest, value))) {
    label += "\\n" + escapeDot(stage::formatValueMeta(*meta));
  }
  if (auto bytes = recordedBytes(manifest, value)) label += "\\n" + std::to_string(*bytes) + " B";
  return label;
}

}  // namespace pipeforge::inspect
