#include "frontend/pt2_names.h"

#include <cctype>

#include "frontend/pt2_import.h"

namespace pipeforge::frontend {

std::string pt2Identifier(const std::string& raw) {
  std::string out;
  for (char c : raw) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "v_" + out;
  return out;
}

std::string pt2ClassName(const std::string& python_type) {
  std::string out = "__torch__.pipeforge_pt2";
  for (const auto& part : pathParts(python_type)) out += "." + pt2Identifier(part);
  if (python_type.empty()) out += std::string(".") + kPt2ClassNotRecorded;
  return out;
}

std::vector<std::string> pathParts(const std::string& path) {
  std::vector<std::string> parts;
  if (path.empty()) return parts;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string relativePath(const std::string& path, const std::string& base) {
  if (base.empty()) return path;
  if (path == base) return "";
  return path.substr(base.size() + 1);
}

}  // namespace pipeforge::frontend
