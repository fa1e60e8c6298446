#include "stage/constant_inputs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/script.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "frontend/pt2_archive.h"

namespace pipeforge::stage {
namespace {

using partitioner::ConstantInput;
using partitioner::SpecError;

bool containsTensor(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  for (const auto& inner : type->containedTypes()) {
    if (containsTensor(inner)) return true;
  }
  return false;
}

// "a float", "an int", "an Optional[float]", "a List[int]".
std::string withArticle(const c10::TypePtr& type) {
  std::string name = type->annotation_str();
  const bool vowel = !name.empty() && std::string("AEIOUaeiou").find(name[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + name;
}

std::string describeArgument(const c10::Argument& arg) {
  std::string text = fmt::format("{} ({}", arg.name(), arg.type()->annotation_str());
  if (arg.default_value()) {
    std::ostringstream value;
    value << *arg.default_value();
    text += " = " + value.str();
  }
  return text + ")";
}

// "its non-tensor arguments are scale (float), use_bias (bool = True)".
std::string nonTensorArguments(const std::vector<c10::Argument>& args) {
  std::vector<std::string> names;
  for (size_t i = 1; i < args.size(); ++i) {
    if (!containsTensor(args[i].type())) names.push_back(describeArgument(args[i]));
  }
  if (names.empty()) return "forward takes no non-tensor argument, so the spec needs no constant_inputs";
  return fmt::format("forward's non-tensor arguments are {}", fmt::join(names, ", "));
}

std::optional<c10::IValue> intOf(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return c10::IValue(static_cast<int64_t>(v));
}

std::optional<c10::IValue> floatOf(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return c10::IValue(v);
}

std::optional<c10::IValue> boolOf(const std::string& text) {
  if (text == "true" || text == "True" || text == "TRUE") return c10::IValue(true);
  if (text == "false" || text == "False" || text == "FALSE") return c10::IValue(false);
  return std::nullopt;
}

// One scalar of `type` (int, float, bool, str, or a number), or nullopt.
std::optional<c10::IValue> scalarOf(const c10::TypePtr& type, const std::string& text) {
  switch (type->kind()) {
    case c10::TypeKind::IntType: return intOf(text);
    case c10::TypeKind::FloatType: return floatOf(text);
    case c10::TypeKind::BoolType: return boolOf(text);
    case c10::TypeKind::StringType: return c10::IValue(text);
    case c10::TypeKind::NumberType: {
      auto as_int = intOf(text);
      return as_int ? as_int : floatOf(text);
    }
    default: return std::nullopt;
  }
}

bool isScalarType(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::NumberType:
      return true;
    default:
      return false;
  }
}

// True for the types constant_inputs can give: scalars, None, Optional of
// them, and lists of int, float or bool.
bool isSupported(const c10::TypePtr& type) {
  if (isScalarType(type) || type->kind() == c10::TypeKind::NoneType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) return isSupported(opt->getElementType());
  if (auto list = type->cast<c10::ListType>()) {
    auto k = list->getElementType()->kind();
    return k == c10::TypeKind::IntType || k == c10::TypeKind::FloatType || k == c10::TypeKind::BoolType;
  }
  return false;
}

std::string given(const ConstantInput& c) {
  switch (c.kind) {
    case ConstantInput::Kind::kNull: return "null";
    case ConstantInput::Kind::kScalar: return "'" + c.items.at(0) + "'";
    case ConstantInput::Kind::kList: return fmt::format("[{}]", fmt::join(c.items, ", "));
  }
  return "?";
}

// The value of `c` as `type`, or nullopt when it is not one.
std::optional<c10::IValue> valueOf(const c10::TypePtr& type, const ConstantInput& c) {
  if (auto opt = type->cast<c10::OptionalType>()) {
    if (c.kind == ConstantInput::Kind::kNull) return c10::IValue();
    return valueOf(opt->getElementType(), c);
  }
  if (type->kind() == c10::TypeKind::NoneType) {
    return c.kind == ConstantInput::Kind::kNull ? std::optional<c10::IValue>(c10::IValue()) : std::nullopt;
  }
  if (auto list = type->cast<c10::ListType>()) {
    if (c.kind != ConstantInput::Kind::kList) return std::nullopt;
    const c10::TypePtr& elem = list->getElementType();
    std::vector<c10::IValue> items;
    for (const auto& item : c.items) {
      auto v = scalarOf(elem, item);
      if (!v) return std::nullopt;
      items.push_back(*v);
    }
    // Typed lists, which TorchScript's constants hold as int[], float[] and bool[].
    switch (elem->kind()) {
      case c10::TypeKind::IntType: {
        c10::List<int64_t> out;
        for (const auto& v : items) out.push_back(v.toInt());
        return c10::IValue(out);
      }
      case c10::TypeKind::FloatType: {
        c10::List<double> out;
        for (const auto& v : items) out.push_back(v.toDouble());
        return c10::IValue(out);
      }
      case c10::TypeKind::BoolType: {
        c10::List<bool> out;
        for (const auto& v : items) out.push_back(v.toBool());
        return c10::IValue(out);
      }
      default:
        return std::nullopt;
    }
  }
  if (c.kind != ConstantInput::Kind::kScalar) return std::nullopt;
  return scalarOf(type, c.items.at(0));
}

nlohmann::json jsonOf(const c10::IValue& v) {
  if (v.isNone()) return nullptr;
  if (v.isBool()) return v.toBool();
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isString()) return v.toStringRef();
  if (v.isList()) {
    nlohmann::json out = nlohmann::json::array();
    for (const c10::IValue& e : v.toListRef()) out.push_back(jsonOf(e));
    return out;
  }
  if (v.isTuple()) {
    nlohmann::json out = nlohmann::json::array();
    for (const c10::IValue& e : v.toTupleRef().elements()) out.push_back(jsonOf(e));
    return out;
  }
  std::ostringstream text;  // a default of another type: pipe.json shows how TorchScript prints it
  text << v;
  return text.str();
}

}  // namespace

torch::jit::Module bakeConstantInputs(const torch::jit::Module& model, const std::vector<ConstantInput>& constants,
                                      std::map<std::string, std::string>& baked) {
  const c10::FunctionSchema& schema = model.get_method("forward").function().getSchema();
  const std::vector<c10::Argument>& args = schema.arguments();

  std::map<std::string, const ConstantInput*> given_by_name;
  for (const auto& c : constants) {
    const std::string key = c.where + ": constant_inputs." + c.name;
    auto arg = std::find_if(args.begin() + 1, args.end(), [&](const c10::Argument& a) { return a.name() == c.name; });
    if (arg == args.end()) {
      throw SpecError(fmt::format("{}: forward has no argument '{}'; {}", key, c.name, nonTensorArguments(args)));
    }
    if (containsTensor(arg->type())) {
      throw SpecError(fmt::format("{}: '{}' is {} argument of forward, which the data gives, not a constant; {}", key,
                                  c.name, withArticle(arg->type()), nonTensorArguments(args)));
    }
    given_by_name[c.name] = &c;
  }

  // The value of every non-tensor argument, by its index in `args`.
  std::map<size_t, c10::IValue> values;
  for (size_t i = 1; i < args.size(); ++i) {
    const c10::Argument& arg = args[i];
    if (containsTensor(arg.type())) continue;
    auto it = given_by_name.find(arg.name());
    if (it != given_by_name.end()) {
      const ConstantInput& c = *it->second;
      const std::string key = c.where + ": constant_inputs." + c.name;
      if (!isSupported(arg.type())) {
        throw SpecError(fmt::format("{}: forward takes {}, which constant_inputs cannot give (it gives int, float, "
                                    "bool, str, None, Optional of them and lists of int, float or bool)",
                                    key, withArticle(arg.type())));
      }
      auto value = valueOf(arg.type(), c);
      if (!value) throw SpecError(fmt::format("{}: forward takes {}, got {}", key, withArticle(arg.type()), given(c)));
      values[i] = *value;
    } else if (arg.default_value()) {
      values[i] = *arg.default_value();  // no constant given: the default, as a call without the argument would
    } else {
      throw SpecError(fmt::format(
          "forward's argument '{}' is {} with no default, and a pipeline gives its stages only tensors from the data; "
          "give its value in the split spec (in a train config: under model:) as constant_inputs: {{{}: ...}}",
          arg.name(), withArticle(arg.type()), arg.name()));
    }
  }
  if (values.empty()) return model;

  torch::jit::Module out = model.clone(/*inplace=*/true);  // new forward, the same tensors
  torch::jit::GraphFunction& fn = torch::jit::toGraphFunction(out.get_method("forward").function());
  std::shared_ptr<torch::jit::Graph> graph = fn.graph();
  TORCH_INTERNAL_ASSERT(graph->inputs().size() == args.size(), "forward's graph and schema disagree");
  torch::jit::WithInsertPoint at_start(graph->block()->param_node()->next());
  // The copy's own schema: its `self` is the copy's class type.
  const c10::FunctionSchema copied = fn.getSchema();
  std::vector<c10::Argument> kept;
  for (size_t i = 0; i < copied.arguments().size(); ++i) {
    if (!values.count(i)) kept.push_back(copied.arguments()[i]);
  }
  for (auto it = values.rbegin(); it != values.rend(); ++it) {  // from the back: erasing keeps earlier indices
    const auto [index, value] = *it;
    torch::jit::Value* constant = nullptr;
    try {
      constant = graph->insertConstant(value);
    } catch (const std::exception&) {
      throw SpecError(fmt::format("forward's argument '{}' has a default TorchScript cannot hold as a constant ({}); "
                                  "give its value in constant_inputs",
                                  args[index].name(), args[index].type()->annotation_str()));
    }
    graph->inputs()[index]->replaceAllUsesWith(constant);
    graph->eraseInput(index);
    baked[args[index].name()] = jsonOf(value).dump();
  }
  fn.setSchema(copied.cloneWithArguments(std::move(kept)));
  return out;
}

void refuseConstantInputsForPt2(const partitioner::SplitSpec& spec, const std::string& model_path) {
  if (spec.constant_inputs.empty()) return;
  if (frontend::detectArchiveKind(model_path) != frontend::ArchiveKind::kPt2) return;
  const auto& c = spec.constant_inputs.front();
  throw SpecError(fmt::format(
      "{}: constant_inputs.{}: '{}' is a torch.export program, whose non-tensor arguments were fixed when it was "
      "exported (the program guards the value it was exported with); drop constant_inputs, or export again with "
      "the value you want, e.g. torch.export.export(model, (x, 2.0))",
      c.where, c.name, model_path));
}

}  // namespace pipeforge::stage
