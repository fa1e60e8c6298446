#include "common/dtype_names.h"

#include <iterator>

namespace pipeforge {
namespace {

struct Spelling {
  const char* name;
  Dtype dtype;
};

// Canonical names first, in dtypeChoices() order; then PyTorch's aliases
// (torch.float is torch.float32, and so on).
constexpr Spelling kSpellings[] = {
    {"float32", Dtype::kFloat32}, {"float64", Dtype::kFloat64}, {"float16", Dtype::kFloat16},
    {"bfloat16", Dtype::kBFloat16}, {"int64", Dtype::kInt64},   {"int32", Dtype::kInt32},
    {"bool", Dtype::kBool},       {"float", Dtype::kFloat32},   {"double", Dtype::kFloat64},
    {"half", Dtype::kFloat16},    {"long", Dtype::kInt64},      {"int", Dtype::kInt32},
};
constexpr int kCanonical = 7;

}  // namespace

const char* dtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kFloat64:
      return "float64";
    case Dtype::kFloat16:
      return "float16";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kInt64:
      return "int64";
    case Dtype::kInt32:
      return "int32";
    case Dtype::kBool:
      return "bool";
  }
  return "?";
}

int dtypeSize(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat64:
    case Dtype::kInt64:
      return 8;
    case Dtype::kFloat32:
    case Dtype::kInt32:
      return 4;
    case Dtype::kFloat16:
    case Dtype::kBFloat16:
      return 2;
    case Dtype::kBool:
      return 1;
  }
  return 0;
}

std::optional<Dtype> parseDtype(std::string_view name) {
  constexpr std::string_view kTorch = "torch.";
  if (name.substr(0, kTorch.size()) == kTorch) name.remove_prefix(kTorch.size());
  for (const Spelling& s : kSpellings) {
    if (name == s.name) return s.dtype;
  }
  return std::nullopt;
}

std::string dtypeChoices() {
  std::string out;
  for (int i = 0; i < kCanonical; ++i) {
    if (i > 0) out += i + 1 == kCanonical ? " or " : ", ";
    out += kSpellings[i].name;
  }
  return out;
}

}  // namespace pipeforge
