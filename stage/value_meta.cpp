#include "stage/value_meta.h"

#include <cctype>
#include <charconv>

#include "common/dtype_names.h"

namespace pipeforge::stage {
namespace {

std::string lowerCase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "6, 8" -> {6, 8}; "" -> {}. nullopt unless every item is a whole number.
std::optional<std::vector<int64_t>> parseSizes(std::string_view text) {
  std::vector<int64_t> sizes;
  while (!text.empty()) {
    while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int64_t size = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), size);
    if (ec != std::errc() || end != item.data() + item.size() || item.empty()) return std::nullopt;
    sizes.push_back(size);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return sizes;
}

}  // namespace

std::string canonicalDtypeName(std::string_view name) {
  // c10's names lower-cased are PyTorch's aliases: Float -> float, Long -> long.
  std::string lower = lowerCase(name);
  auto dtype = parseDtype(lower);
  return dtype ? dtypeName(*dtype) : lower;
}

std::optional<ValueMeta> parseValueMeta(std::string_view text) {
  size_t open = text.find('[');
  if (open == 0 || open == std::string_view::npos || text.back() != ']') return std::nullopt;
  auto sizes = parseSizes(text.substr(open + 1, text.size() - open - 2));
  if (!sizes) return std::nullopt;
  return ValueMeta{canonicalDtypeName(text.substr(0, open)), std::move(*sizes)};
}

std::string formatValueMeta(const ValueMeta& meta) {
  std::string out = meta.dtype + "[";
  for (size_t i = 0; i < meta.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(meta.shape[i]);
  return out + "]";
}

std::optional<int64_t> valueBytes(const ValueMeta& meta) {
  auto dtype = parseDtype(meta.dtype);
  if (!dtype) return std::nullopt;
  int64_t bytes = dtypeSize(*dtype);
  for (int64_t size : meta.shape) bytes *= size;
  return bytes;
}

std::string describeValueMeta(const std::string& recorded) {
  auto meta = parseValueMeta(recorded);
  if (!meta) return recorded;
  auto bytes = valueBytes(*meta);
  return formatValueMeta(*meta) + (bytes ? " (" + std::to_string(*bytes) + " B)" : "");
}

}  // namespace pipeforge::stage
