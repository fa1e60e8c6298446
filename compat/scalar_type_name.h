// PyTorch's own names of element types, for messages: "float64", "int64",
// "bfloat16" (what `torch.float64` prints without "torch."), where c10's
// toString says "Double" and "Long". Torch-free: the enum is declared here.
#pragma once

#include <cstdint>
#include <string>

namespace c10 {
enum class ScalarType : int8_t;
}

namespace pipeforge::compat {

std::string scalarTypeName(c10::ScalarType type);

}  // namespace pipeforge::compat
