#include "frontend/pt2_archive.h"
#include "frontend/pt2_weights.h"

#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <ATen/ATen.h>

#include "compat/torch_compat.h"
#include "compat/zip_record.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

namespace pipeforge::frontend {
namespace {

// Ordered: weights keep the file's order (nlohmann::json would sort the keys).
using json = nlohmann::ordered_json;

// Schema majors this reader understands. torch 2.13 writes 8.20; minor bumps
// only add fields and union members, which the importer reports by name when
// it meets one it does not know.
constexpr int kSchemaMajor = 8;
constexpr const char* kArchiveVersion = "0";
constexpr const char* kLegacyJsonName = "serialized_exported_program.json";

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  return s.substr(start);
}

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool startsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The zip's central directory (at its end) lists every entry name in plain
// text: enough to recognise the legacy flat format without parsing the zip.
bool tailMentions(const std::string& path, const std::string& needle) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return false;
  std::streamoff size = in.tellg();
  std::streamoff start = std::max<std::streamoff>(0, size - (1 << 20));
  in.seekg(start);
  std::string tail(static_cast<size_t>(size - start), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  return tail.find(needle) != std::string::npos;
}

std::string readText(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name) {
  auto [data, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(data.get()), size);
}

// PyTorchStreamReader's message for a zip it cannot open, in our words: the
// miniz reason without the checkpoint advice that follows it.
std::string zipProblem(const std::string& what) {
  if (what.find("failed finding central directory") != std::string::npos) {
    return "the zip's central directory is missing, so the file is truncated";
  }
  if (what.find("not a ZIP archive") != std::string::npos) return "the file is not a zip archive";
  std::string line = firstLine(what);
  auto cut = line.find(". This is an internal miniz error");
  return cut == std::string::npos ? line : line.substr(0, cut);
}

std::string legacyMessage(const std::string& path) {
  return fmt::format(
      "'{}' is a torch.export archive from torch 2.1-2.7 (a flat zip with {}); Pipeforge reads the PT2 archive "
      "format of torch >= 2.9. Re-save it under torch 2.13: torch.export.save(torch.export.load('{}'), 'model.pt2')",
      path, kLegacyJsonName, path);
}

// A string metadata field, or "".
std::string metadataString(const json& node, const char* key) {
  auto meta = node.find("metadata");
  if (meta == node.end() || !meta->is_object()) return "";
  auto it = meta->find(key);
  return it != meta->end() && it->is_string() ? it->get<std::string>() : "";
}

// Splits on `sep` at bracket depth 0, as torch's deserializer does (module
// type names may hold commas inside [] or ()).
std::vector<std::string> splitTopLevel(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[' || c == '(') ++depth;
    if (c == ']' || c == ')') --depth;
    if (c == sep && depth == 0) {
      parts.push_back(current);
      current.clear();
      continue;
    }
    current += c;
  }
  parts.push_back(current);
  return parts;
}

at::ScalarType scalarTypeOf(int code, const std::string& what) {
  // torch/_export/serde/schema.py ScalarType (not c10's numbering).
  switch (code) {
    case 1: return at::kByte;
    case 2: return at::kChar;
    case 3: return at::kShort;
    case 4: return at::kInt;
    case 5: return at::kLong;
    case 6: return at::kHalf;
    case 7: return at::kFloat;
    case 8: return at::kDouble;
    case 9: return at::kComplexHalf;
    case 10: return at::kComplexFloat;
    case 11: return at::kComplexDouble;
    case 12: return at::kBool;
    case 13: return at::kBFloat16;
#if PIPEFORGE_TORCH_AT_LEAST(2, 3)  // LibTorch 1.13 has neither float8 nor the wide unsigned types
    case 28: return at::kUInt16;
    case 29: return at::kFloat8_e4m3fn;
    case 30: return at::kFloat8_e5m2;
    case 31: return at::kFloat8_e4m3fnuz;
    case 32: return at::kFloat8_e5m2fnuz;
    case 34: return at::kUInt32;
    case 35: return at::kUInt64;
#endif
    default: break;
  }
  throw Pt2Error(fmt::format("{} has dtype code {}, which this reader does not know; export the model with "
                             "float, integer or bool tensors",
                             what, code));
}

int64_t symIntValue(const json& sym, const std::string& fqn) {
  if (sym.contains("as_int")) return pt2Int64(sym.at("as_int"), "a size or stride of weight '" + fqn + "'");
  throw Pt2Error(fmt::format("weight '{}' has a symbolic size or stride ({}); weights must have static shapes",
                             fqn, sym.dump()));
}

std::vector<int64_t> symInts(const json& list, const std::string& fqn) {
  std::vector<int64_t> out;
  for (const auto& s : list) out.push_back(symIntValue(s, fqn));
  return out;
}

}  // namespace

ArchiveKind detectArchiveKind(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (reader.hasRecord("archive_format") && trim(readText(reader, "archive_format")) == "pt2") {
      return ArchiveKind::kPt2;
    }
    return ArchiveKind::kTorchScript;
  } catch (const c10::Error&) {
    // Not openable by PyTorchStreamReader: the legacy flat zip has no root folder.
  }
  if (tailMentions(path, kLegacyJsonName)) return ArchiveKind::kLegacyExport;
  if (endsWith(path, ".pt2")) return ArchiveKind::kPt2;  // let the PT2 reader explain what is broken
  return ArchiveKind::kTorchScript;
}

int64_t pt2Int64(const json& value, const std::string& what) {
  const bool fits = value.is_number_integer() &&
                    (!value.is_number_unsigned() || value.get<uint64_t>() <= uint64_t{INT64_MAX});
  if (!fits) {
    throw Pt2Error(fmt::format("{} must be an integer, got {}; the exported program is corrupt, re-export the "
                               "model with torch.export.save",
                               what, value.is_number() ? value.dump() : std::string(value.type_name())));
  }
  return value.get<int64_t>();
}

int pt2Int(const json& value, const std::string& what) {
  int64_t v = pt2Int64(value, what);
  if (v < INT_MIN || v > INT_MAX) {
    throw Pt2Error(fmt::format("{} is {}, out of range; the exported program is corrupt, re-export the model with "
                               "torch.export.save",
                               what, v));
  }
  return static_cast<int>(v);
}

int c10ScalarTypeOf(int pt2_code, const std::string& what) {
  return static_cast<int>(scalarTypeOf(pt2_code, what));
}

std::vector<Pt2ModuleFrame> parseModuleStack(const std::string& text) {
  std::vector<Pt2ModuleFrame> frames;
  if (text.empty()) return frames;
  for (const std::string& entry : splitTopLevel(text, ';')) {
    auto fields = splitTopLevel(entry, ',');
    if (fields.size() < 3) continue;
    Pt2ModuleFrame f{fields[0], fields[1], fields[2]};
    for (size_t i = 3; i < fields.size(); ++i) f.type += "," + fields[i];
    // Export passes mark nodes they add with a frame that names no module.
    if (f.key == "_empty_nn_module_stack_from_metadata_hook") continue;
    frames.push_back(std::move(f));
  }
  return frames;
}

std::vector<Pt2Node> pt2GraphNodes(const json& graph) {
  std::vector<Pt2Node> nodes;
  for (const json& node : graph.at("nodes")) {
    Pt2Node n;
    n.name = node.contains("name") && node.at("name").is_string() ? node.at("name").get<std::string>() : "";
    n.target = node.at("target").get<std::string>();
    n.module_stack = parseModuleStack(metadataString(node, "nn_module_stack"));
    nodes.push_back(std::move(n));
  }
  return nodes;
}

Pt2SourceLocation pt2SourceLocation(const json& node) {
  Pt2SourceLocation where;
  if (!node.is_object() || !node.contains("metadata") || !node.at("metadata").is_object()) return where;
  const json& meta = node.at("metadata");
  if (!meta.contains("stack_trace") || !meta.at("stack_trace").is_string()) return where;
  const std::string trace = meta.at("stack_trace").get<std::string>();
  // Frames read `File "<path>", line <n>, in <function>\n    <code>`,
  // outermost first. The innermost frame outside torch's own package is the
  // user's line (an nn.Linear call, not F.linear inside linear.py).
  struct Frame {
    std::string path;
    int line = 0;
    std::string code;
  };
  std::vector<Frame> frames;
  const std::string file_tag = "File \"";
  for (size_t at = trace.find(file_tag); at != std::string::npos; at = trace.find(file_tag, at + 1)) {
    Frame f;
    size_t start = at + file_tag.size();
    size_t end = trace.find('"', start);
    if (end == std::string::npos) break;
    f.path = trace.substr(start, end - start);
    const std::string line_tag = ", line ";
    size_t digits = end + 1;
    if (trace.compare(digits, line_tag.size(), line_tag) == 0) {
      digits += line_tag.size();
      size_t stop = digits;
      while (stop < trace.size() && std::isdigit(static_cast<unsigned char>(trace[stop]))) ++stop;
      if (stop > digits && stop - digits < 10) f.line = std::stoi(trace.substr(digits, stop - digits));
    }
    size_t code = trace.find('\n', end);
    if (code != std::string::npos && trace.compare(code + 1, 2, "  ") == 0) {
      size_t code_end = trace.find('\n', code + 1);
      std::string text = trace.substr(code + 1, code_end == std::string::npos ? std::string::npos : code_end - code - 1);
      size_t first = text.find_first_not_of(" \t");
      size_t last = text.find_last_not_of(" \t\r");
      if (first != std::string::npos && text.compare(first, file_tag.size(), file_tag) != 0) {
        f.code = text.substr(first, last - first + 1);
      }
    }
    frames.push_back(std::move(f));
  }
  if (frames.empty()) return where;
  auto inTorch = [](const std::string& path) {
    return path.find("-packages/torch/") != std::string::npos;
  };
  const Frame* chosen = &frames.back();
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    if (!inTorch(it->path)) {
      chosen = &*it;
      break;
    }
  }
  where.file = chosen->path;
  auto slash = where.file.find_last_of("/\\");
  if (slash != std::string::npos) where.file = where.file.substr(slash + 1);
  where.line = chosen->line;
  where.code = chosen->code;
  return where;
}

std::string pt2SourceLine(const json& node) {
  Pt2SourceLocation where = pt2SourceLocation(node);
  if (where.file.empty()) return "";
  return where.line > 0 ? where.file + ":" + std::to_string(where.line) : where.file;
}

struct Pt2Archive::Impl {
  std::string path;
  std::string model_name;
  std::string schema_version;
  std::string torch_version;
  std::vector<std::string> verifiers;
  json program;
  Pt2Signature signature;
  std::vector<Pt2Node> nodes;
  std::vector<std::string> module_call_graph;
  std::vector<Pt2TensorEntry> entries;
  std::map<std::string, at::Tensor> tensors;
};

namespace {

void checkHeader(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path) {
  if (!reader.hasRecord("archive_format")) {
    throw Pt2Error(fmt::format("'{}' is a zip without an archive_format record, so not a torch.export archive; "
                               "save the model with torch.export.save(torch.export.export(model, args), path)",
                               path));
  }
  std::string format = trim(readText(reader, "archive_format"));
  if (format != "pt2") {
    throw Pt2Error(fmt::format("'{}' has archive_format '{}', expected 'pt2'; save the model with torch.export.save",
                               path, format));
  }
  std::string version = reader.hasRecord("archive_version") ? trim(readText(reader, "archive_version")) : "";
  if (version != kArchiveVersion) {
    throw Pt2Error(fmt::format("'{}' has archive_version '{}', but this Pipeforge reads PT2 archive version {} "
                               "(torch 2.8-2.13); re-save the model with torch.export.save under torch 2.13",
                               path, version.empty() ? "(missing)" : version, kArchiveVersion));
  }
  if (reader.hasRecord("byteorder")) {
    std::string order = trim(readText(reader, "byteorder"));
    if (order != "little") {
      throw Pt2Error(fmt::format("'{}' was written on a {}-endian machine; its raw weights cannot be read here. "
                                 "Re-save it on a little-endian machine",
                                 path, order));
    }
  }
}

std::string findModelJson(caffe2::serialize::PyTorchStreamReader& reader, const std::string& path) {
  std::vector<std::string> models;
  bool aoti = false;
  for (const auto& name : reader.getAllRecords()) {
    if (startsWith(name, "models/") && endsWith(name, ".json")) models.push_back(name);
    if (startsWith(name, "data/aotinductor/")) aoti = true;
  }
  if (models.empty() && aoti) {
    throw Pt2Error(fmt::format(
        "'{}' is an AOTInductor package (compiled code under data/aotinductor/, no exported graph); Pipeforge "
        "splits the graph itself. Save the ExportedProgram instead: torch.export.save(ep, 'model.pt2') rather "
        "than torch._inductor.aoti_compile_and_package(ep)",
        path));
  }
  if (models.empty()) {
    throw Pt2Error(fmt::format("'{}' holds no models/<name>.json, so no exported graph; save the model with "
                               "torch.export.save",
                               path));
  }
  std::sort(models.begin(), models.end());
  if (models.size() == 1) return models[0];
  if (std::find(models.begin(), models.end(), "models/model.json") != models.end()) return "models/model.json";
  std::string names;
  for (const auto& m : models) names += (names.empty() ? "" : ", ") + m;
  throw Pt2Error(fmt::format("'{}' packages several programs ({}) and none is named 'model'; save one program "
                             "per file with torch.export.save",
                             path, names));
}

void checkSchema(const json& program, const std::string& path) {
  if (!program.is_object() || !program.contains("graph_module") || !program.contains("schema_version")) {
    throw Pt2Error(fmt::format("'{}': the exported program JSON has no graph_module or schema_version; the file "
                               "is not an ExportedProgram (re-save with torch.export.save)",
                               path));
  }
  const json& v = program.at("schema_version");
  int major = v.contains("major") ? pt2Int(v.at("major"), "'" + path + "': schema_version.major") : -1;
  int minor = v.contains("minor") ? pt2Int(v.at("minor"), "'" + path + "': schema_version.minor") : -1;
  if (major != kSchemaMajor) {
    throw Pt2Error(fmt::format("'{}' uses export schema version {}.{}, but this Pipeforge reads schema {}.x "
                               "(torch 2.5-2.13 write it); re-export the model with torch 2.13",
                               path, major, minor, kSchemaMajor));
  }
}

// An input or output spec is a union: an object with exactly one member, its kind.
std::pair<std::string, const json&> specMember(const json& spec, const char* which) {
  if (!spec.is_object() || spec.size() != 1) {
    throw Pt2Error(fmt::format("graph signature: an {} spec must be an object with one member (its kind), got {}; "
                               "re-export the model with torch 2.13",
                               which, spec.dump()));
  }
  return {spec.begin().key(), spec.begin().value()};
}

Pt2Signature parseSignature(const json& sig) {
  Pt2Signature out;
  static const std::map<std::string, Pt2InputKind> input_kinds = {
      {"user_input", Pt2InputKind::kUserInput},       {"parameter", Pt2InputKind::kParameter},
      {"buffer", Pt2InputKind::kBuffer},              {"tensor_constant", Pt2InputKind::kTensorConstant},
      {"custom_obj", Pt2InputKind::kCustomObject},    {"token", Pt2InputKind::kToken},
      {"constant_input", Pt2InputKind::kConstantInput}};
  static const std::map<std::string, std::pair<Pt2OutputKind, const char*>> output_kinds = {
      {"user_output", {Pt2OutputKind::kUserOutput, ""}},
      {"loss_output", {Pt2OutputKind::kLossOutput, ""}},
      {"buffer_mutation", {Pt2OutputKind::kBufferMutation, "buffer_name"}},
      {"parameter_mutation", {Pt2OutputKind::kParameterMutation, "parameter_name"}},
      {"gradient_to_parameter", {Pt2OutputKind::kGradientToParameter, "parameter_name"}},
      {"gradient_to_user_input", {Pt2OutputKind::kGradientToUserInput, "user_input_name"}},
      {"user_input_mutation", {Pt2OutputKind::kUserInputMutation, "user_input_name"}},
      {"token", {Pt2OutputKind::kToken, ""}}};
  for (const json& spec : sig.at("input_specs")) {
    const auto& [tag, body] = specMember(spec, "input");
    auto kind = input_kinds.find(tag);
    if (kind == input_kinds.end()) {
      throw Pt2Error("graph signature: unknown input kind '" + tag + "'; re-export the model with torch 2.13");
    }
    Pt2InputSpec in;
    in.kind = kind->second;
    const json& arg = body.contains("arg") ? body.at("arg") : json::object();
    if (in.kind == Pt2InputKind::kUserInput) {
      // An Argument union: as_tensor {name}, or a symbolic value as_sym_* {as_name}.
      // A user input with neither (a baked constant) keeps an empty value.
      if (arg.contains("as_tensor")) {
        in.value = arg.at("as_tensor").at("name").get<std::string>();
      } else if (!arg.empty() && arg.begin().value().is_object() && arg.begin().value().contains("as_name")) {
        in.value = arg.begin().value().at("as_name").get<std::string>();
      }
    } else if (arg.is_object() && arg.contains("name")) {
      in.value = arg.at("name").get<std::string>();
    }
    if (in.kind == Pt2InputKind::kConstantInput) in.value = body.value("name", "");
    for (const char* field : {"parameter_name", "buffer_name", "tensor_constant_name", "custom_obj_name"}) {
      if (body.contains(field)) in.target = body.at(field).get<std::string>();
    }
    if (body.contains("persistent") && body.at("persistent").is_boolean()) in.persistent = body.at("persistent");
    out.inputs.push_back(std::move(in));
  }
  for (const json& spec : sig.at("output_specs")) {
    const auto& [tag, body] = specMember(spec, "output");
    auto kind = output_kinds.find(tag);
    if (kind == output_kinds.end()) {
      throw Pt2Error("graph signature: unknown output kind '" + tag + "'; re-export the model with torch 2.13");
    }
    Pt2OutputSpec o;
    o.kind = kind->second.first;
    const json& arg = body.at("arg");
    if (arg.contains("as_tensor")) {
      o.value = arg.at("as_tensor").at("name").get<std::string>();
    } else if (arg.contains("name")) {
      o.value = arg.at("name").get<std::string>();  // TensorArgument directly (mutation outputs)
    } else {
      o.literal = arg.dump();
    }
    if (*kind->second.second) o.target = body.value(kind->second.second, "");
    out.outputs.push_back(std::move(o));
  }
  return out;
}

// Note [Mapped weights]
// ~~~~~~~~~~~~~~~~~~~~~
// A split needs the program and the weights' metadata, not their values: the
// stage writer copies each weight record from the source archive into its
// stage archive one record at a time (stage/pt2_stage_writer.cpp). So the
// archive's weights are not read at open: each record's storage is the
// record's bytes in a private, copy-on-write mapping of the file. A page is
// read only when something reads the tensor (constant folding, a timing run,
// example inputs run through the model), and only that page. Reading every
// record into memory made a split's peak RSS 1.29x the file (issue 25).
//
// torch.export.save stores records uncompressed and 64-byte aligned; a record
// stored compressed, and every record under LibTorch 1.x (whose reader does
// not give a record's size), is read as before.

// A private read/write mapping of the whole archive; writes stay in memory.
struct MappedFile {
  void* base = MAP_FAILED;
  std::size_t size = 0;
  ~MappedFile() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
  static std::shared_ptr<MappedFile> open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    auto file = std::make_shared<MappedFile>();
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      file->size = static_cast<std::size_t>(st.st_size);
      file->base = ::mmap(nullptr, file->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    }
    ::close(fd);
    return file->base == MAP_FAILED ? nullptr : file;
  }
};

// The record's bytes as a Storage over the mapping, or an undefined Storage
// when it cannot be mapped (Note [Mapped weights]).
c10::Storage mappedRecord(caffe2::serialize::PyTorchStreamReader& reader, const std::string& record,
                          const std::shared_ptr<MappedFile>& file) {
  if (!file) return {};
  std::optional<compat::RecordRange> range = compat::recordRange(reader, record);
  if (!range || range->header + 30 > file->size || range->offset + range->size > file->size) return {};
  const auto* header = static_cast<const unsigned char*>(file->base) + range->header;
  const unsigned method = header[8] | (header[9] << 8);  // the local header's compression method; 0: stored
  if (method != 0) return {};
  auto* keep = new std::shared_ptr<MappedFile>(file);
  c10::DataPtr data(static_cast<char*>(file->base) + range->offset, keep,
                    [](void* ctx) { delete static_cast<std::shared_ptr<MappedFile>*>(ctx); }, at::kCPU);
  return c10::Storage(c10::Storage::use_byte_size_t(), range->size, std::move(data), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

// Reads one payload config (weights or constants) into tensors; views of one
// storage with the same layout become one tensor object (tied weights).
struct Payloads {
  std::string path;  // the archive, for messages
  std::vector<Pt2TensorEntry> entries;
  std::map<std::string, at::Tensor> tensors;
};

void loadPayloads(caffe2::serialize::PyTorchStreamReader& reader, const std::shared_ptr<MappedFile>& mapping,
                  const std::string& folder, const std::string& model, bool constants, Payloads& impl) {
  std::string config_name = fmt::format("{}/{}_{}_config.json", folder, model, constants ? "constants" : "weights");
  if (!reader.hasRecord(config_name)) {
    if (reader.hasRecord(fmt::format("{}/{}.pt", folder, model))) {
      throw Pt2Error(fmt::format("'{}' stores its {} as one pickled {}/{}.pt (torch 2.8's layout); Pipeforge reads the "
                                 "raw layout of torch >= 2.9. Re-save it under torch 2.13: "
                                 "torch.export.save(torch.export.load(path), path)",
                                 impl.path, constants ? "constants" : "weights", folder, model));
    }
    return;  // no weights at all (a parameterless model)
  }
  json config;
  try {
    config = json::parse(readText(reader, config_name));
  } catch (const json::exception& e) {
    throw Pt2Error(fmt::format("'{}': {} is not valid JSON ({}); the archive is corrupt, re-save it", impl.path,
                               config_name, e.what()));
  }
  // One Storage per record, so every view of it (tied weights, slices) aliases it.
  std::map<std::string, c10::Storage> storages;
  std::map<std::tuple<std::string, int, std::vector<int64_t>, std::vector<int64_t>, int64_t>, at::Tensor> views;
  for (const auto& [fqn, payload] : config.at("config").items()) {
    std::string file = payload.at("path_name").get<std::string>();
    if (payload.value("use_pickle", false)) {
      throw Pt2Error(fmt::format("'{}': '{}' is stored pickled (a tensor subclass or script object); Pipeforge reads "
                                 "plain tensors only. Export the model with plain tensor parameters and buffers",
                                 impl.path, fqn));
    }
    const json& meta = payload.at("tensor_meta");
    int layout = meta.contains("layout") ? pt2Int(meta.at("layout"), "the layout of '" + fqn + "'") : 7;
    if (layout != 7) {
      throw Pt2Error(fmt::format("'{}': '{}' has a non-strided layout (code {}); only dense tensors can be split",
                                 impl.path, fqn, layout));
    }
    int dtype_code = pt2Int(meta.at("dtype"), "the dtype of '" + fqn + "'");
    at::ScalarType dtype = scalarTypeOf(dtype_code, "tensor '" + fqn + "'");
    auto sizes = symInts(meta.at("sizes"), fqn);
    auto strides = symInts(meta.at("strides"), fqn);
    int64_t offset = meta.contains("storage_offset") && !meta.at("storage_offset").is_null()
                         ? symIntValue(meta.at("storage_offset"), fqn)
                         : 0;
    auto key = std::make_tuple(file, dtype_code, sizes, strides, offset);
    at::Tensor tensor;
    if (auto it = views.find(key); it != views.end()) {
      tensor = it->second;
    } else {
      std::string record = folder + "/" + file;
      if (!reader.hasRecord(record)) {
        throw Pt2Error(fmt::format("'{}': '{}' points to {}, which the archive does not hold; the file is "
                                   "incomplete, re-save it",
                                   impl.path, fqn, record));
      }
      if (meta.contains("device") && meta.at("device").is_object() &&
          meta.at("device").value("type", "") == "meta") {
        // Note [Weights by FQN]: every meta tensor points at one empty
        // record, so records say nothing of ties; each gets its own tensor.
        tensor = at::empty_strided(sizes, strides, at::TensorOptions().dtype(dtype).device(at::kMeta));
        bool is_param = payload.value("is_param", false);
        impl.entries.push_back({fqn, is_param, constants, /*on_meta=*/true, ""});
        impl.tensors[fqn] = tensor;
        continue;
      }
      auto storage_it = storages.find(file);
      if (storage_it == storages.end()) {
        c10::Storage storage = mappedRecord(reader, record, mapping);
        if (!storage) {
          auto [data, bytes] = reader.getRecord(record);
          storage = c10::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(data), /*allocator=*/nullptr,
                                 /*resizable=*/false);
        }
        storage_it = storages.emplace(file, std::move(storage)).first;
      }
      size_t bytes = storage_it->second.nbytes();
      bool empty = std::find(sizes.begin(), sizes.end(), 0) != sizes.end();
      // The element index the view reaches last, in exact arithmetic: sizes,
      // strides and offset come from the file and may be anything.
      if (sizes.size() != strides.size() || offset < 0) {
        throw Pt2Error(fmt::format("'{}': '{}' has {} sizes, {} strides and offset {}; the archive is corrupt, re-save "
                                   "it",
                                   impl.path, fqn, sizes.size(), strides.size(), offset));
      }
      __int128 last = offset;
      bool bad = false;
      for (size_t d = 0; d < sizes.size(); ++d) {
        bad = bad || sizes[d] < 0 || strides[d] < 0 || sizes[d] > (int64_t{1} << 48) || strides[d] > (int64_t{1} << 48);
        if (!bad && sizes[d] > 0) last += static_cast<__int128>(sizes[d] - 1) * strides[d];
      }
      __int128 needed_exact = empty ? 0 : (last + 1) * static_cast<__int128>(c10::elementSize(dtype));
      if (bad || needed_exact > static_cast<__int128>(INT64_MAX)) {
        throw Pt2Error(fmt::format("'{}': '{}' has sizes {} and strides {} that no tensor can have; the archive is "
                                   "corrupt, re-save it",
                                   impl.path, fqn, fmt::join(sizes, ", "), fmt::join(strides, ", ")));
      }
      size_t needed = static_cast<size_t>(needed_exact);
      if (bytes == 0 && needed > 0) {
        tensor = at::zeros(sizes, at::TensorOptions().dtype(dtype));  // a weightless (fake) export
      } else if (needed > bytes) {
        throw Pt2Error(fmt::format("'{}': '{}' needs {} bytes of {} but the record holds {}; the file is truncated "
                                   "or corrupt, re-save it",
                                   impl.path, fqn, needed, record, bytes));
      } else {
        tensor = at::empty({0}, at::TensorOptions().dtype(dtype));
        tensor.set_(storage_it->second, offset, sizes, strides);
      }
      views[key] = tensor;
    }
    bool is_param = payload.value("is_param", false);
    if (is_param && meta.value("requires_grad", false) && at::isFloatingType(dtype)) tensor.set_requires_grad(true);
    impl.entries.push_back({fqn, is_param, constants, false, ""});
    impl.tensors[fqn] = tensor;
  }
}

}  // namespace

Pt2Archive Pt2Archive::open(const std::string& path, const Pt2OpenOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Pt2Error("model file '" + path + "' does not exist; check the path");
  if (detectArchiveKind(path) == ArchiveKind::kLegacyExport) throw Pt2Error(legacyMessage(path));

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> reader;
  try {
    reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
  } catch (const c10::Error& e) {
    throw Pt2Error(fmt::format("cannot open '{}' as a PT2 archive: {}; re-save the model with torch.export.save",
                               path, zipProblem(e.what_without_backtrace())));
  }
  try {
    checkHeader(*reader, path);
    std::string model_json = findModelJson(*reader, path);
    impl->model_name = model_json.substr(7, model_json.size() - 7 - 5);
    try {
      impl->program = json::parse(readText(*reader, model_json));
    } catch (const json::exception& e) {
      throw Pt2Error(fmt::format("'{}': {} is not valid JSON ({}); the archive is corrupt, re-save it", path,
                                 model_json, e.what()));
    }
    checkSchema(impl->program, path);
    const json& v = impl->program.at("schema_version");
    impl->schema_version = fmt::format("{}.{}", pt2Int(v.at("major"), "schema_version.major"),
                                       v.contains("minor") ? pt2Int(v.at("minor"), "schema_version.minor") : 0);
    impl->torch_version = impl->program.value("torch_version", "<=2.4");
    if (impl->program.contains("verifiers") && impl->program.at("verifiers").is_array()) {
      for (const auto& s : impl->program.at("verifiers")) impl->verifiers.push_back(s.get<std::string>());
    }
    const json& gm = impl->program.at("graph_module");
    impl->signature = parseSignature(gm.at("signature"));
    impl->nodes = pt2GraphNodes(gm.at("graph"));
    if (gm.contains("module_call_graph")) {
      for (const json& entry : gm.at("module_call_graph")) impl->module_call_graph.push_back(entry.value("fqn", ""));
    }
    Payloads payloads{path, {}, {}};
    const std::shared_ptr<MappedFile> mapping = MappedFile::open(path);
    loadPayloads(*reader, mapping, "data/weights", impl->model_name, /*constants=*/false, payloads);
    loadPayloads(*reader, mapping, "data/constants", impl->model_name, /*constants=*/true, payloads);
    impl->entries = std::move(payloads.entries);
    impl->tensors = std::move(payloads.tensors);
    const bool meta_export = std::any_of(impl->entries.begin(), impl->entries.end(),
                                         [](const Pt2TensorEntry& e) { return e.on_meta; });
    fillFromWeights(path, options, impl->entries, impl->tensors);
    // Filled, a meta export runs on the CPU (Note [Weights by FQN]).
    if (meta_export && !options.weights.empty()) metaDevicesToCpu(impl->program);
  } catch (const json::exception& e) {
    throw Pt2Error(fmt::format("'{}': the exported program does not have the expected structure ({}); re-export the "
                               "model with torch 2.13",
                               path, e.what()));
  } catch (const c10::Error& e) {
    throw Pt2Error(fmt::format("cannot read '{}' (truncated or corrupt?): {}; re-save the model with "
                               "torch.export.save",
                               path, firstLine(e.what_without_backtrace())));
  }
  return Pt2Archive(std::move(impl));
}

Pt2Archive::Pt2Archive(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pt2Archive::~Pt2Archive() = default;
Pt2Archive::Pt2Archive(Pt2Archive&&) noexcept = default;
Pt2Archive& Pt2Archive::operator=(Pt2Archive&&) noexcept = default;

const std::string& Pt2Archive::path() const { return impl_->path; }
const std::string& Pt2Archive::modelName() const { return impl_->model_name; }
const std::string& Pt2Archive::schemaVersion() const { return impl_->schema_version; }
const std::string& Pt2Archive::torchVersion() const { return impl_->torch_version; }
const std::vector<std::string>& Pt2Archive::verifiers() const { return impl_->verifiers; }
const Pt2Signature& Pt2Archive::signature() const { return impl_->signature; }
const std::vector<Pt2Node>& Pt2Archive::nodes() const { return impl_->nodes; }
const std::vector<std::string>& Pt2Archive::moduleCallGraph() const { return impl_->module_call_graph; }
const nlohmann::ordered_json& Pt2Archive::graphJson() const { return impl_->program.at("graph_module").at("graph"); }
const nlohmann::ordered_json& Pt2Archive::programJson() const { return impl_->program; }
const std::vector<Pt2TensorEntry>& Pt2Archive::tensors() const { return impl_->entries; }
bool Pt2Archive::hasTensor(const std::string& fqn) const { return impl_->tensors.count(fqn) > 0; }

const at::Tensor& Pt2Archive::stored(const std::string& fqn) const {
  auto it = impl_->tensors.find(fqn);
  if (it == impl_->tensors.end()) {
    throw Pt2Error(fmt::format("'{}': the graph signature names '{}', but no weights or constants config holds it; "
                               "the archive is incomplete, re-save it",
                               impl_->path, fqn));
  }
  return it->second;
}

const Pt2TensorEntry& Pt2Archive::entry(const std::string& fqn) const {
  for (const auto& e : impl_->entries) {
    if (e.fqn == fqn) return e;
  }
  stored(fqn);  // throws the message of an absent tensor
  throw Pt2Error(fmt::format("'{}': no weights or constants config holds '{}'", impl_->path, fqn));
}

const at::Tensor& Pt2Archive::tensor(const std::string& fqn) const {
  const at::Tensor& held = stored(fqn);
  auto e = std::find_if(impl_->entries.begin(), impl_->entries.end(),
                        [&](const Pt2TensorEntry& x) { return x.fqn == fqn; });
  if (e == impl_->entries.end() || e->convert_to < 0) return held;
  const auto type = static_cast<at::ScalarType>(e->convert_to);
  at::Tensor converted = held.to(type).contiguous();
  converted.set_requires_grad(held.requires_grad());
  // Every name of the tie held the same tensor; each gets the one conversion.
  const at::Tensor before = held;
  for (auto& other : impl_->entries) {
    auto it = impl_->tensors.find(other.fqn);
    if (it == impl_->tensors.end() || !it->second.is_same(before)) continue;
    it->second = converted;
    other.convert_to = -1;
    other.source_view = false;
  }
  return impl_->tensors.at(fqn);
}

// Every value name an Argument (or list of them) reads; subgraphs excluded.
void pt2ValueNames(const nlohmann::ordered_json& j, std::vector<std::string>& out) {
  if (j.is_array()) {
    for (const auto& e : j) pt2ValueNames(e, out);
    return;
  }
  if (!j.is_object()) return;
  for (const auto& [key, value] : j.items()) {
    if (key == "as_graph") continue;
    if ((key == "as_tensor" || key == "as_optional_tensor") && value.is_object() && value.contains("name") &&
        value.at("name").is_string()) {
      out.push_back(value.at("name").get<std::string>());
    } else if (key == "as_tensors" && value.is_array()) {
      for (const auto& t : value) {
        if (t.is_object() && t.contains("name")) out.push_back(t.at("name").get<std::string>());
      }
    } else if (key == "as_name" && value.is_string()) {
      out.push_back(value.get<std::string>());
    } else {
      pt2ValueNames(value, out);
    }
  }
}

std::vector<std::string> pt2NodeUses(const nlohmann::ordered_json& node) {
  std::vector<std::string> out;
  for (const auto& in : node.at("inputs")) pt2ValueNames(in.at("arg"), out);
  return out;
}

std::vector<std::string> pt2NodeDefs(const nlohmann::ordered_json& node) {
  std::vector<std::string> out;
  pt2ValueNames(node.at("outputs"), out);
  return out;
}

}  // namespace pipeforge::frontend
