// Names the PT2 importer makes: TorchScript identifiers from export value
// names, class names from Python types, and module paths taken apart.
#pragma once

#include <string>
#include <vector>

namespace pipeforge::frontend {

// A TorchScript identifier made from an export value name: every character
// that is not a letter or digit becomes '_', and "v_" goes before a leading
// digit ("getitem.1" -> "getitem_1", "0" -> "v_0").
std::string pt2Identifier(const std::string& raw);

// The qualified class name of a rebuilt module whose Python class is
// `python_type` ("generate_zoo.Block" -> "__torch__.pipeforge_pt2.generate_zoo.Block";
// "" -> "__torch__.pipeforge_pt2.ClassNotRecorded").
std::string pt2ClassName(const std::string& python_type);

// "a.b.c" -> {"a", "b", "c"}; "" -> {}.
std::vector<std::string> pathParts(const std::string& path);

// "a.b.c" relative to "a" -> "b.c"; a path relative to itself is "".
// `path` must lie within `base`.
std::string relativePath(const std::string& path, const std::string& base);

}  // namespace pipeforge::frontend
