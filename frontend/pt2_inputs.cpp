#include "frontend/pt2_inputs.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <regex>

#include <fmt/format.h>

#include "frontend/pt2_archive.h"

namespace pipeforge::frontend {
namespace {

using json = nlohmann::ordered_json;

// A JSON integer, or `fallback` for anything else (range bounds may be
// written as "int_oo" or huge floats for "unbounded").
std::int64_t integerOr(const json& v, std::int64_t fallback) {
  if (v.is_number_integer() || v.is_number_unsigned()) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) return fallback;
    return v.get<std::int64_t>();
  }
  return fallback;
}

// torch/_export/serde/schema.py's ScalarType codes, for the dtypes
// common/dtype_names.h names.
std::string dtypeNameOfCode(const json& code) {
  switch (integerOr(code, 0)) {
    case 4: return "int32";
    case 5: return "int64";
    case 6: return "float16";
    case 7: return "float32";
    case 8: return "float64";
    case 12: return "bool";
    case 13: return "bfloat16";
    default: return "";
  }
}

}  // namespace

std::vector<Pt2UserInput> pt2UserInputs(const Pt2Archive& archive) {
  const json& graph = archive.graphJson();
  const json& program = archive.programJson();
  const json empty = json::object();
  const json& tensor_values = graph.contains("tensor_values") ? graph.at("tensor_values") : empty;
  const json& ranges = program.contains("range_constraints") && program.at("range_constraints").is_object()
                           ? program.at("range_constraints")
                           : empty;
  static const std::regex bare_symbol(R"(^Symbol\('([A-Za-z_][A-Za-z0-9_]*)'.*\)$)");
  std::vector<Pt2UserInput> out;
  for (const Pt2InputSpec& in : archive.signature().inputs) {
    if (in.kind != Pt2InputKind::kUserInput) continue;
    Pt2UserInput user{in.value, {}, {}, ""};
    auto meta = tensor_values.find(in.value);
    if (meta != tensor_values.end() && meta->is_object() && meta->contains("dtype")) {
      user.dtype = dtypeNameOfCode(meta->at("dtype"));
    }
    if (meta != tensor_values.end() && meta->is_object() && meta->contains("sizes") && meta->at("sizes").is_array()) {
      for (const json& size : meta->at("sizes")) {
        Pt2DimRange dim{0, -1};
        std::int64_t example = -1;
        if (size.is_object() && size.contains("as_expr") && size.at("as_expr").is_object() &&
            size.at("as_expr").contains("hint") && size.at("as_expr").at("hint").is_object() &&
            size.at("as_expr").at("hint").contains("as_int")) {
          example = integerOr(size.at("as_expr").at("hint").at("as_int"), -1);
        }
        if (size.is_object() && size.contains("as_int")) {
          std::int64_t n = integerOr(size.at("as_int"), -1);
          if (n < 0) {
            throw Pt2Error(fmt::format("'{}': input '{}' has a size that is not a whole number ({}); the exported "
                                       "program is corrupt, re-export the model",
                                       archive.path(), in.value, size.at("as_int").dump()));
          }
          dim = {n, n};
          example = n;
        } else if (size.is_object() && size.contains("as_expr") && size.at("as_expr").is_object()) {
          // A dynamic dimension: its range, when the expression is one symbol.
          const json& expr = size.at("as_expr");
          std::smatch m;
          std::string text = expr.value("expr_str", std::string());
          if (std::regex_match(text, m, bare_symbol) && ranges.contains(m[1].str()) &&
              ranges.at(m[1].str()).is_object()) {
            const json& r = ranges.at(m[1].str());
            dim.min = r.contains("min_val") ? std::max<std::int64_t>(0, integerOr(r.at("min_val"), 0)) : 0;
            dim.max = r.contains("max_val") ? integerOr(r.at("max_val"), -1) : -1;
            if (dim.max >= 0 && dim.max < dim.min) dim.max = -1;
          }
        }
        user.dims.push_back(dim);
        user.example.push_back(example);
      }
    }
    out.push_back(std::move(user));
  }
  return out;
}

}  // namespace pipeforge::frontend
