#include "stage/manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "common/dtype_names.h"
#include "stage/file_digest.h"
#include "common/xxh3.h"
#include "stage/value_meta.h"

namespace pipeforge::stage {
namespace {

using nlohmann::json;

// The manifest's "stage_format" for torch.export stage files (stage_<i>.pt2).
constexpr const char* kPt2StageFormat = "pt2";

bool isPt2Split(const PipeManifest& m) {
  if (m.stages.empty()) return false;
  return std::all_of(m.stages.begin(), m.stages.end(), [](const StageInfo& s) {
    return s.file.size() > 4 && s.file.compare(s.file.size() - 4, 4, ".pt2") == 0;
  });
}

json sourceToJson(const ValueSource& s) {
  if (s.kind == ValueSource::Kind::kInput) return json{{"from", "input"}, {"index", s.index}};
  return json{{"from", "stage"}, {"stage", s.stage}, {"index", s.index}};
}

// An integer field. nlohmann's get<int>() takes 1.5 as 1 and makes 1e300
// undefined behaviour, so only JSON integers that fit an int pass.
int intAt(const json& j, const char* key) {
  const json& v = j.at(key);
  const bool fits = v.is_number_unsigned()  ? v.get<std::uint64_t>() <= INT_MAX
                    : v.is_number_integer() ? v.get<std::int64_t>() >= INT_MIN && v.get<std::int64_t>() <= INT_MAX
                                            : false;
  if (!fits) {
    throw ManifestError(std::string("'") + key + "' must be an integer, got " +
                        (v.is_number() ? v.dump() : std::string(v.type_name())));
  }
  return v.get<int>();
}

ValueSource sourceFromJson(const json& j) {
  ValueSource s;
  std::string from = j.at("from").get<std::string>();
  if (from == "input") {
    s.kind = ValueSource::Kind::kInput;
  } else if (from == "stage") {
    s.kind = ValueSource::Kind::kStage;
    s.stage = intAt(j, "stage");
  } else {
    throw ManifestError("value source 'from' must be \"input\" or \"stage\", got \"" + from + "\"");
  }
  s.index = intAt(j, "index");
  return s;
}

// A stage file lives in the manifest's folder: a path that is absolute or
// climbs out with `..` would make a copied or downloaded split read (and
// `pipeforge split --force` replace) files elsewhere.
void checkStageFileName(const std::string& file, int index) {
  bool climbs = false;
  size_t start = 0;
  while (start <= file.size()) {
    size_t end = file.find('/', start);
    if (end == std::string::npos) end = file.size();
    if (file.compare(start, end - start, "..") == 0 && end - start == 2) climbs = true;
    start = end + 1;
  }
  if (file.empty() || file.front() == '/' || climbs || file.find('\0') != std::string::npos) {
    throw ManifestError("stage " + std::to_string(index) + " names file \"" + file +
                        "\"; stage files must be relative paths inside the split folder (like \"stage_" +
                        std::to_string(index) + ".pt\"); re-run `pipeforge split`");
  }
}

void checkSource(const ValueSource& s, int consumer_stage, const PipeManifest& m, const std::string& where) {
  if (s.kind == ValueSource::Kind::kInput) {
    if (s.index < 0 || s.index >= static_cast<int>(m.inputs.size())) {
      throw ManifestError(where + " reads model input " + std::to_string(s.index) + " but the model has " +
                          std::to_string(m.inputs.size()) + " inputs");
    }
    return;
  }
  if (s.stage < 0 || s.stage >= consumer_stage) {
    throw ManifestError(where + " reads stage " + std::to_string(s.stage) + "; sources must be earlier stages (0.." +
                        std::to_string(consumer_stage - 1) + ")");
  }
  if (s.index < 0 || s.index >= m.stages[s.stage].num_outputs) {
    throw ManifestError(where + " reads output " + std::to_string(s.index) + " of stage " + std::to_string(s.stage) +
                        ", which has " + std::to_string(m.stages[s.stage].num_outputs) + " outputs");
  }
}

}  // namespace

std::string manifestToJson(const PipeManifest& m) {
  json j;
  j["format"] = kManifestFormat;
  j["num_stages"] = m.num_stages;
  j["source"] = m.source;
  j["inputs"] = m.inputs;
  j["outputs"] = json::array();
  for (const auto& o : m.outputs) j["outputs"].push_back(sourceToJson(o));
  j["stages"] = json::array();
  for (const auto& s : m.stages) {
    json js;
    js["index"] = s.index;
    js["file"] = s.file;
    js["inputs"] = json::array();
    for (const auto& in : s.inputs) js["inputs"].push_back(sourceToJson(in));
    js["num_outputs"] = s.num_outputs;
    js["parameters"] = s.parameters;
    if (!s.parameter_meta.empty()) js["parameter_meta"] = s.parameter_meta;
    js["buffers"] = s.buffers;
    if (!s.output_meta.empty()) js["output_meta"] = s.output_meta;
    if (!s.xxh3.empty()) js["xxh3_128"] = s.xxh3;
    if (!s.sha256.empty()) js["sha256"] = s.sha256;
    j["stages"].push_back(std::move(js));
  }
  j["tied"] = m.tied;
  j["unused"] = m.unused;
  if (!m.input_dims.empty()) {
    json inputs = json::array();
    for (const auto& dims : m.input_dims) {
      json jd = json::array();
      for (const auto& d : dims) jd.push_back(json::array({d.min, d.max < 0 ? json(nullptr) : json(d.max)}));
      inputs.push_back(std::move(jd));
    }
    j["input_dims"] = std::move(inputs);
  }
  if (!m.input_dtypes.empty()) j["input_dtypes"] = m.input_dtypes;
  if (!m.input_meta.empty()) j["input_meta"] = m.input_meta;
  if (!m.input_embeddings.empty()) {
    json embeddings = json::array();
    for (const auto& e : m.input_embeddings) {
      embeddings.push_back(e.module.empty() ? json(nullptr) : json{{"module", e.module}, {"rows", e.rows}});
    }
    j["input_embeddings"] = std::move(embeddings);
  }
  if (!m.constant_inputs.empty()) {
    json constants = json::object();
    for (const auto& [name, value] : m.constant_inputs) constants[name] = json::parse(value);
    j["constant_inputs"] = std::move(constants);
  }
  // Note [PT2 stage files]: a split of a `.pt2` writes torch.export stage
  // files and says so; TorchScript splits keep the manifest they always had.
  if (isPt2Split(m)) j["stage_format"] = kPt2StageFormat;
  return j.dump(1) + "\n";
}

std::string inputDtype(const PipeManifest& m, std::size_t i) {
  if (i < m.input_dtypes.size() && !m.input_dtypes[i].empty()) return m.input_dtypes[i];
  if (i < m.input_meta.size()) {
    if (auto meta = parseValueMeta(m.input_meta[i]); meta && parseDtype(meta->dtype)) return meta->dtype;
  }
  return "";
}

namespace {

StageInfo stageFromJson(const json& js) {
  StageInfo s;
  s.index = intAt(js, "index");
  s.file = js.at("file").get<std::string>();
  checkStageFileName(s.file, s.index);
  for (const auto& in : js.at("inputs")) s.inputs.push_back(sourceFromJson(in));
  s.num_outputs = intAt(js, "num_outputs");
  s.parameters = js.value("parameters", std::vector<std::string>{});
  s.parameter_meta = js.value("parameter_meta", std::vector<std::string>{});
  if (!s.parameter_meta.empty() && s.parameter_meta.size() != s.parameters.size()) {
    throw ManifestError("stage " + std::to_string(s.index) + " has " + std::to_string(s.parameter_meta.size()) +
                        " parameter_meta entries for " + std::to_string(s.parameters.size()) +
                        " parameters; re-run `pipeforge split`");
  }
  s.buffers = js.value("buffers", std::vector<std::string>{});
  s.output_meta = js.value("output_meta", std::vector<std::string>{});
  s.sha256 = js.value("sha256", "");
  if (!s.sha256.empty() && !isSha256(s.sha256)) {
    throw ManifestError("stage " + std::to_string(s.index) + " has sha256 \"" + s.sha256 +
                        "\", not 64 hex digits; re-run `pipeforge split`");
  }
  s.xxh3 = js.value("xxh3_128", "");
  if (!s.xxh3.empty() && !isXxh3(s.xxh3)) {
    throw ManifestError("stage " + std::to_string(s.index) + " has xxh3_128 \"" + s.xxh3 +
                        "\", not 32 hex digits; re-run `pipeforge split`");
  }
  return s;
}

// One input's "input_dims": [min, max] per dimension, max null when unbounded.
std::vector<InputDim> inputDimsFromJson(const json& dims) {
  std::vector<InputDim> parsed;
  for (const json& d : dims) {
    if (!d.is_array() || d.size() != 2) throw ManifestError("input_dims entries must be [min, max] pairs");
    json pair = {{"min", d.at(0)}, {"max", d.at(1).is_null() ? json(-1) : d.at(1)}};
    InputDim dim{intAt(pair, "min"), intAt(pair, "max")};
    if (dim.min < 0 || (dim.max >= 0 && dim.max < dim.min)) {
      throw ManifestError("input_dims has the range [" + std::to_string(dim.min) + ", " + std::to_string(dim.max) +
                          "]; re-run `pipeforge split`");
    }
    parsed.push_back(dim);
  }
  return parsed;
}

// The optional per-input records: input_dims, input_dtypes, input_meta, one per model input each.
void readInputRecords(const json& j, PipeManifest& m) {
  if (j.contains("input_dims")) {
    for (const json& dims : j.at("input_dims")) m.input_dims.push_back(inputDimsFromJson(dims));
    if (m.input_dims.size() != m.inputs.size()) {
      throw ManifestError("input_dims lists " + std::to_string(m.input_dims.size()) + " inputs but the model has " +
                          std::to_string(m.inputs.size()) + "; re-run `pipeforge split`");
    }
  }
  if (j.contains("input_dtypes")) {
    m.input_dtypes = j.at("input_dtypes").get<std::vector<std::string>>();
    if (m.input_dtypes.size() != m.inputs.size()) {
      throw ManifestError("input_dtypes lists " + std::to_string(m.input_dtypes.size()) +
                          " inputs but the model has " + std::to_string(m.inputs.size()) +
                          "; re-run `pipeforge split`");
    }
    for (const std::string& name : m.input_dtypes) {
      if (!name.empty() && !parseDtype(name)) {
        throw ManifestError("input_dtypes has \"" + name + "\", which is not a dtype (" + dtypeChoices() +
                            "); re-run `pipeforge split`");
      }
    }
  }
  if (j.contains("input_embeddings")) {
    for (const json& e : j.at("input_embeddings")) {
      InputEmbedding embedding;
      if (!e.is_null()) {
        embedding.module = e.at("module").get<std::string>();
        embedding.rows = e.at("rows").get<int64_t>();
        if (embedding.module.empty() || embedding.rows < 1) {
          throw ManifestError("input_embeddings has an entry without a module or with rows < 1; re-run `pipeforge "
                              "split`");
        }
      }
      m.input_embeddings.push_back(std::move(embedding));
    }
    if (m.input_embeddings.size() != m.inputs.size()) {
      throw ManifestError("input_embeddings lists " + std::to_string(m.input_embeddings.size()) +
                          " inputs but the model has " + std::to_string(m.inputs.size()) +
                          "; re-run `pipeforge split`");
    }
  }
  m.input_meta = j.value("input_meta", std::vector<std::string>{});
  if (!m.input_meta.empty() && m.input_meta.size() != m.inputs.size()) {
    throw ManifestError("input_meta lists " + std::to_string(m.input_meta.size()) + " inputs but the model has " +
                        std::to_string(m.inputs.size()) + "; re-run `pipeforge split`");
  }
}

// Note [PT2 stage files]: "stage_format" is absent (TorchScript) or "pt2", and
// then every stage file is a .pt2.
void checkStageFormat(const json& j, const PipeManifest& m) {
  const std::string stage_format = j.value("stage_format", "");
  if (!stage_format.empty() && stage_format != kPt2StageFormat) {
    throw ManifestError("stage_format is \"" + stage_format + "\"; this version reads TorchScript stages (no "
                        "stage_format) and \"" + kPt2StageFormat + "\"; re-run `pipeforge split` with this version");
  }
  if (!stage_format.empty() && !isPt2Split(m)) {
    throw ManifestError("stage_format is \"pt2\" but not every stage file ends in .pt2; re-run `pipeforge split`");
  }
}

// The manifest's fields, each checked on its own; throws ManifestError or json::exception.
PipeManifest parseManifestJson(const std::string& text) {
  PipeManifest m;
  json j = json::parse(text);
  std::string format = j.at("format").get<std::string>();
  if (format != kManifestFormat) {
    throw ManifestError("format is \"" + format + "\", expected \"" + kManifestFormat +
                        "\"; re-run `pipeforge split` with this version");
  }
  m.num_stages = intAt(j, "num_stages");
  m.source = j.value("source", "");
  m.inputs = j.at("inputs").get<std::vector<std::string>>();
  for (const auto& o : j.at("outputs")) m.outputs.push_back(sourceFromJson(o));
  for (const auto& js : j.at("stages")) m.stages.push_back(stageFromJson(js));
  if (j.contains("tied")) m.tied = j.at("tied").get<std::vector<std::vector<std::string>>>();
  m.unused = j.value("unused", std::vector<std::string>{});
  readInputRecords(j, m);
  if (j.contains("constant_inputs")) {
    const json& constants = j.at("constant_inputs");
    if (!constants.is_object()) throw ManifestError("constant_inputs must map argument names to values");
    for (auto it = constants.begin(); it != constants.end(); ++it) {
      m.constant_inputs[it.key()] = it.value().dump();  // a record of what was baked in: any JSON value reads
    }
  }
  checkStageFormat(j, m);
  return m;
}

// The fields agree: stages numbered 0..num_stages-1, every source names a
// model input or an earlier stage's output.
void checkManifestAgrees(const PipeManifest& m, const std::string& origin) {
  if (m.num_stages != static_cast<int>(m.stages.size()) || m.num_stages < 1) {
    throw ManifestError(origin + ": num_stages is " + std::to_string(m.num_stages) + " but " +
                        std::to_string(m.stages.size()) + " stages are listed");
  }
  for (int i = 0; i < m.num_stages; ++i) {
    const StageInfo& s = m.stages[i];
    if (s.index != i) {
      throw ManifestError(origin + ": stage at position " + std::to_string(i) + " has index " + std::to_string(s.index));
    }
    for (size_t k = 0; k < s.inputs.size(); ++k) {
      checkSource(s.inputs[k], i, m, origin + ": stage " + std::to_string(i) + " input " + std::to_string(k));
    }
  }
  for (size_t k = 0; k < m.outputs.size(); ++k) {
    checkSource(m.outputs[k], m.num_stages, m, origin + ": model output " + std::to_string(k));
  }
}

}  // namespace

PipeManifest manifestFromJson(const std::string& text, const std::string& origin) {
  PipeManifest m;
  try {
    m = parseManifestJson(text);
  } catch (const ManifestError& e) {
    throw ManifestError(origin + ": " + e.what());
  } catch (const json::exception& e) {
    throw ManifestError(origin + ": malformed manifest: " + e.what());
  }
  checkManifestAgrees(m, origin);
  return m;
}

PipeManifest readManifest(const std::string& directory) {
  std::string path = directory + "/" + kManifestFileName;
  std::ifstream in(path);
  if (!in) {
    throw ManifestError("no " + std::string(kManifestFileName) + " in '" + directory +
                        "'; pass a folder written by `pipeforge split`");
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return manifestFromJson(buffer.str(), path);
}

void verifyStageFile(const std::string& directory, const StageInfo& stage) {
  const std::string fix = "re-run `pipeforge split` (or restore the file) before training on it";
  if (!stage.xxh3.empty()) {
    verifyXxh3Digest(directory + "/" + stage.file, stage.xxh3, "stage file", fix);
    return;
  }
  verifyFileDigest(directory + "/" + stage.file, stage.sha256, "stage file", fix);
}

}  // namespace pipeforge::stage
