// What a split saw of a value crossing a cut: its dtype and shape, as pipe.json
// records it ("float32[6, 8]") and `pipeforge inspect` shows it, with its size.
// Torch-free: stage/ writes it from tensors, inspect/ reads it from text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace at {
class Tensor;
}

namespace pipeforge::stage {

struct ValueMeta {
  std::string dtype;            // canonical when known ("float32"), else lower-cased as written ("uint8")
  std::vector<int64_t> shape;   // empty for a scalar tensor

  friend bool operator==(const ValueMeta& a, const ValueMeta& b) { return a.dtype == b.dtype && a.shape == b.shape; }
};

// Our dtype names, PyTorch's aliases and c10's spelling ("Float", which
// older splits wrote into pipe.json) as the canonical name: "Float" -> "float32",
// "long" -> "int64". A name we do not know comes back lower-cased ("Byte" -> "byte").
std::string canonicalDtypeName(std::string_view name);

// "float32[6, 8]", "Float[6, 8]" (older pipe.json files), "int64[]".
// nullopt for text of another form.
std::optional<ValueMeta> parseValueMeta(std::string_view text);

// The pipe.json form: formatValueMeta({"float32", {6, 8}}) == "float32[6, 8]".
std::string formatValueMeta(const ValueMeta& meta);

// A tensor's dtype and shape in that form (defined with the split, which
// links LibTorch; this header stays torch-free).
std::string tensorMeta(const at::Tensor& t);

// Bytes of the dense tensor: element size × element count (a float32[2, 16, 32]
// is 4096 B). nullopt for a dtype whose element size we do not know.
std::optional<int64_t> valueBytes(const ValueMeta& meta);

// "float32[6, 8] (192 B)", or the text as recorded when it does not parse.
std::string describeValueMeta(const std::string& recorded);

}  // namespace pipeforge::stage
