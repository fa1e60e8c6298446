#include "common/byte_size.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace pipeforge {
namespace {

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::optional<double> parseByteSize(std::string_view text) {
  static constexpr std::array<std::pair<const char*, double>, 9> kUnits = {{
      {"kib", 1024.0},
      {"mib", 1024.0 * 1024},
      {"gib", 1024.0 * 1024 * 1024},
      {"tib", 1024.0 * 1024 * 1024 * 1024},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
      {"b", 1.0},
  }};
  const std::string lower = lowercase(text);
  for (const auto& [unit, factor] : kUnits) {
    const std::string_view suffix(unit);
    if (lower.size() <= suffix.size() || lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    std::string number = lower.substr(0, lower.size() - suffix.size());
    while (!number.empty() && number.back() == ' ') number.pop_back();
    if (number.empty() || !(std::isdigit(static_cast<unsigned char>(number.front())) || number.front() == '.')) {
      return std::nullopt;
    }
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size() || !std::isfinite(value)) return std::nullopt;
    return value * factor;
  }
  return std::nullopt;
}

std::string formatByteSize(double bytes) {
  static constexpr std::array<const char*, 6> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  std::size_t unit = 0;
  double value = bytes;
  while (unit + 1 < kUnits.size() && std::fabs(value) >= 1024.0) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.4g %s", value, kUnits[unit]);
  return buffer;
}

}  // namespace pipeforge
