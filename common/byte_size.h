// Sizes in bytes as people write them on a command line ("512MiB", "8GB")
// and as Pipeforge prints them ("6.5 GiB").
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pipeforge {

// The bytes `text` names when it is a non-negative number followed by a byte
// unit: B, kB/KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers
// of 1024), any case, with or without a space: parseByteSize("512MiB") ==
// 536870912. std::nullopt for anything else, a plain number included.
std::optional<double> parseByteSize(std::string_view text);

// `bytes` in the largest binary unit it reaches, four significant digits:
// formatByteSize(6.5 * 1024 * 1024 * 1024) == "6.5 GiB", formatByteSize(100) == "100 B".
std::string formatByteSize(double bytes);

}  // namespace pipeforge
