// The element types a user names in a split spec or a config, and their
// spellings: ours ("float32") and PyTorch's ("float", "torch.float32",
// "long", "half", ...). Torch-free; stage/ maps a Dtype to at::ScalarType.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pipeforge {

enum class Dtype { kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kBool };

// The canonical name: dtypeName(Dtype::kInt64) == "int64".
const char* dtypeName(Dtype dtype);

// Bytes per element: dtypeSize(Dtype::kBFloat16) == 2.
int dtypeSize(Dtype dtype);

// A canonical name or one of PyTorch's aliases, with or without "torch.":
// "float" and "torch.float32" are kFloat32, "long" kInt64, "half" kFloat16,
// "double" kFloat64, "int" kInt32. nullopt for anything else.
std::optional<Dtype> parseDtype(std::string_view name);

// "float32, float64, float16, bfloat16, int64, int32 or bool", for messages.
std::string dtypeChoices();

}  // namespace pipeforge
