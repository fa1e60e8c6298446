// Text and numbers as SVG (and XML) documents want them, written once for
// every drawing Pipeforge makes: schedule timelines and training curves.
#pragma once

#include <string>
#include <string_view>

namespace pipeforge {

// `text` with &, <, > and " escaped, safe inside an element or a "quoted"
// attribute: svgEscape("a<b & \"c\"") == "a&lt;b &amp; &quot;c&quot;".
std::string svgEscape(std::string_view text);

// A coordinate with two decimals, never "-0.00": svgNumber(-0.001) == "0.00".
// Fixed precision keeps the drawings byte-identical across runs.
std::string svgNumber(double value);

}  // namespace pipeforge
