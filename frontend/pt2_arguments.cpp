#include "frontend/pt2_arguments.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/ir/ir.h>

#include <limits>
#include <vector>

#include "frontend/errors.h"
#include "frontend/pt2_archive.h"

namespace pipeforge::frontend {

using json = nlohmann::ordered_json;
using torch::jit::Graph;
using torch::jit::Value;

double pt2FloatOf(const json& j) {
  if (j.is_string()) {
    std::string s = j.get<std::string>();
    if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
    throw Pt2Error("float argument '" + s + "' is not a number");
  }
  return j.get<double>();
}

namespace {

// One Argument read at a time: its node (`where`) is named in every error.
class ArgumentReader {
 public:
  ArgumentReader(const Pt2ArgumentScope& scope, const std::string& where)
      : scope_(scope), graph_(*scope.graph), where_(where) {}

  Value* read(const json& arg) const {
    if (!arg.is_object() || arg.size() != 1) fail(where_ + ": malformed argument " + arg.dump());
    // Not `const auto& [tag, v] = *arg.items().begin()`: that binds to a
    // temporary iterator and reads it after it is gone (found by fuzz_pt2_json).
    const std::string tag = arg.begin().key();
    const json& v = arg.begin().value();
    if (Value* value = scalar(tag, v)) return value;
    if (Value* value = constantList(tag, v)) return value;
    if (Value* value = named(tag, v)) return value;
    fail(where_ + ": argument kind '" + tag + "' cannot be expressed in TorchScript; export without it");
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { throw Pt2Error(located(message)); }

  // A message with the file named first, also for the helpers that throw
  // Pt2Error themselves (pt2Int, pt2Int64).
  std::string located(const std::string& message) const { return "'" + scope_.source + "': " + message; }

  // A single constant; nullptr when `tag` is not one.
  Value* scalar(const std::string& tag, const json& v) const {
    if (tag == "as_none") return graph_.insertConstant(c10::IValue());
    if (tag == "as_int") return graph_.insertConstant(pt2Int64(v, located(where_ + ": an int argument")));
    // The schema numbers these enums its own way; TorchScript wants c10's.
    if (tag == "as_scalar_type") {
      int code = pt2Int(v, located(where_ + ": a dtype code"));
      return graph_.insertConstant(static_cast<int64_t>(c10ScalarTypeOf(code, where_)));
    }
    if (tag == "as_memory_format") {
      int code = pt2Int(v, located(where_ + ": a memory format code"));
      return graph_.insertConstant(static_cast<int64_t>(memoryFormatOf(code)));
    }
    if (tag == "as_layout") {
      int code = pt2Int(v, located(where_ + ": a layout code"));
      return graph_.insertConstant(static_cast<int64_t>(layoutOf(code)));
    }
    if (tag == "as_float") return graph_.insertConstant(pt2FloatOf(v));
    if (tag == "as_bool") return graph_.insertConstant(v.get<bool>());
    if (tag == "as_string") return graph_.insertConstant(v.get<std::string>());
    if (tag == "as_device") return graph_.insertConstant(deviceOf(v));
    if (tag == "as_complex") {
      return graph_.insertConstant(c10::complex<double>(pt2FloatOf(v.at("real")), pt2FloatOf(v.at("imag"))));
    }
    return nullptr;
  }

  // A list constant; nullptr when `tag` is not one.
  Value* constantList(const std::string& tag, const json& v) const {
    if (tag == "as_ints") {
      c10::List<int64_t> ints;
      for (const auto& i : v) ints.push_back(pt2Int64(i, located(where_ + ": an int list argument")));
      return graph_.insertConstant(ints);
    }
    if (tag == "as_floats") {
      std::vector<double> fs;
      for (const auto& f : v) fs.push_back(pt2FloatOf(f));
      return graph_.insertConstant(c10::List<double>(fs));
    }
    if (tag == "as_bools") {
      c10::List<bool> bs;
      for (const auto& b : v) bs.push_back(b.get<bool>());
      return graph_.insertConstant(bs);
    }
    if (tag == "as_strings") return graph_.insertConstant(c10::List<std::string>(v.get<std::vector<std::string>>()));
    return nullptr;
  }

  // Tensors and symbolic values, alone or in lists; nullptr when `tag` names neither.
  Value* named(const std::string& tag, const json& v) const {
    if (tag == "as_tensor") return scope_.resolve(v.at("name").get<std::string>());
    if (tag == "as_sym_int" || tag == "as_sym_bool" || tag == "as_sym_float") return symbolic(v);
    if (tag == "as_sym_ints") return listOf(v, c10::IntType::get(), [&](const json& e) { return symbolic(e); });
    if (tag == "as_sym_bools") return listOf(v, c10::BoolType::get(), [&](const json& e) { return symbolic(e); });
    if (tag == "as_sym_floats") return listOf(v, c10::FloatType::get(), [&](const json& e) { return symbolic(e); });
    if (tag == "as_tensors") {
      return listOf(v, c10::TensorType::get(),
                    [&](const json& e) { return scope_.resolve(e.at("name").get<std::string>()); });
    }
    if (tag == "as_optional_tensor") return optionalTensor(v);
    if (tag == "as_optional_tensors") {
      return listOf(v, c10::OptionalType::create(c10::TensorType::get()),
                    [&](const json& e) { return optionalTensor(e); });
    }
    return nullptr;
  }

  Value* optionalTensor(const json& v) const {
    return v.contains("as_tensor") ? scope_.resolve(v.at("as_tensor").at("name").get<std::string>())
                                   : graph_.insertConstant(c10::IValue());
  }

  Value* symbolic(const json& sym) const {
    if (sym.contains("as_name")) return scope_.resolve(sym.at("as_name").get<std::string>());
    if (sym.contains("as_int")) return graph_.insertConstant(pt2Int64(sym.at("as_int"), located("a symbolic int")));
    if (sym.contains("as_bool")) return graph_.insertConstant(sym.at("as_bool").get<bool>());
    if (sym.contains("as_float")) return graph_.insertConstant(pt2FloatOf(sym.at("as_float")));
    fail("unknown symbolic value " + sym.dump());
  }

  // A prim::ListConstruct of `one` of each element.
  Value* listOf(const json& list, const c10::TypePtr& elem, const std::function<Value*(const json&)>& one) const {
    std::vector<Value*> values;
    for (const auto& e : list) values.push_back(one(e));
    return graph_.insertNode(graph_.createList(elem, values))->output();
  }

  c10::Device deviceOf(const json& v) const {
    std::string device = v.at("type").get<std::string>();
    if (v.contains("index") && !v.at("index").is_null()) {
      device += ":" + std::to_string(pt2Int(v.at("index"), located(where_ + ": a device index")));
    }
    return c10::Device(device);
  }

  // torch/_export/serde/schema.py MemoryFormat and Layout -> c10.
  c10::MemoryFormat memoryFormatOf(int code) const {
    switch (code) {
      case 1: return c10::MemoryFormat::Contiguous;
      case 2: return c10::MemoryFormat::ChannelsLast;
      case 3: return c10::MemoryFormat::ChannelsLast3d;
      case 4: return c10::MemoryFormat::Preserve;
      default: fail(fmt::format("{}: unknown memory format code {}", where_, code));
    }
  }

  c10::Layout layoutOf(int code) const {
    switch (code) {
      case 1: return c10::kSparse;
      case 2: return c10::kSparseCsr;
      case 3: return c10::kSparseCsc;
      case 4: return c10::kSparseBsr;
      case 5: return c10::kSparseBsc;
      case 6: return c10::kMkldnn;
      case 7: return c10::kStrided;
      default: fail(fmt::format("{}: unknown layout code {}", where_, code));
    }
  }

  const Pt2ArgumentScope& scope_;
  Graph& graph_;
  const std::string& where_;
};

}  // namespace

Value* readPt2Argument(const Pt2ArgumentScope& scope, const json& arg, const std::string& where) {
  return ArgumentReader(scope, where).read(arg);
}

}  // namespace pipeforge::frontend
