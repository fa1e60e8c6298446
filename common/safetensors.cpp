#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "common/atomic_file.h"

// Note [Safetensors]
// ~~~~~~~~~~~~~~~~~~
// The format transformers' save_pretrained writes, as safetensors 0.8.0 reads
// and writes it: 8 bytes little-endian N, N bytes of UTF-8 JSON, then the data buffer, to
// which every data_offsets pair is relative. Pipeforge reads it torch-free:
// the file is mapped read-only and a tensor is a checked byte range of the
// mapping with a dtype name and a shape; the layer that needs torch turns it
// into a tensor. Nothing is copied, so opening a 100 GB checkpoint costs its
// headers, and the pages a caller touches.
//
// The reader accepts what safetensors 0.8.0 accepts, and refuses a little
// more: a key repeated anywhere in the header (safetensors itself refuses
// repeated tensor names and fields, but keeps the last of two equal
// __metadata__ keys) and shapes of more than kMaxDims dimensions; everything
// it refuses is in Note [Untrusted headers].
//
// The writer writes the bytes safetensors 0.8.0 writes for the same tensors:
// compact JSON with __metadata__ first (omitted when empty; its keys sorted,
// where Rust's HashMap leaves them in any order), then the tensors in data
// order with their fields as dtype, shape, data_offsets; the header padded with
// spaces to a multiple of 8, so the data starts 8-aligned; tensors packed back
// to back, ordered by dtype, "largest alignment first", then by name. That
// dtype order is safetensors' own Dtype enum, reversed: U64 I64 F64 C64 F32 U32
// I32 BF16 F16 U16 I16, the 1-byte types F8_E5M2FNUZ ... U8, then F6_E3M2
// F6_E2M3 F4 BOOL (BOOL last: it is first in the enum). Within one element
// size it is the enum's order, not the name's (F32 before U32 before I32), so
// kDtypes below lists the enum in its order and the writer sorts by that rank.
// Every tensor starts at a multiple of its element size, as the format's
// readers may assume when they cast a mapped pointer. A file written here and
// one written by safetensors.torch.save_file of the same tensors and at most
// one metadata key are equal, byte for byte (tests/common/safetensors_test.cpp
// checks it).
//
// A writer holds one tensor at a time (SafetensorsEntry::fill): the header is
// known from names, dtypes and shapes alone, so it is written first and each
// tensor's bytes follow into the temporary file of Note [Atomic writes].
//
// A folder follows save_pretrained (transformers 5.17): one model.safetensors,
// or shards model-0000i-of-0000N.safetensors filled greedily in the callers'
// order plus model.safetensors.index.json. The files are each atomic, the
// folder is not: shards are written first, the index last, then files of an
// earlier save that the new one does not overwrite are removed (other shard
// counts; a single model.safetensors, which every reader prefers to an index,
// when the new save is sharded; an index when it is not).

// Note [Untrusted headers]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint comes from the Hub or a colleague's disk; its header is input,
// and a data_offsets pair is a pointer offset: trusted, [0, 2^64) would hand
// out bytes past the mapping. So before any pointer is formed:
//   - the length field is at most kMaxSafetensorsHeader and the header fits in
//     the file; the header holds no NUL byte (nlohmann's parser stops at one,
//     so NUL padding would otherwise pass) and is one JSON object, nested at
//     most kMaxJsonDepth deep, with no key twice in any object (nlohmann keeps
//     the last of two equal keys without a word; the parse callback counts);
//   - __metadata__ is null or an object of strings;
//   - each tensor has a dtype of the 22 (upper case), at most kMaxDims
//     dimensions, each a non-negative integer, and two non-negative integer
//     offsets with begin <= end; numel x bits is computed with overflow checks,
//     sub-byte dtypes must end on a byte boundary, and end - begin must equal
//     that byte count;
//   - sorted by offsets, the tensors tile the data exactly: the first begins
//     at 0, each begins where the one before ended, the last ends at the end of
//     the file. A gap, an overlap (so no two names share bytes), trailing bytes
//     and a file cut short are each refused with their own message.
// Only then is `data` set, as bytes + 8 + N + begin, and nbytes <= the file's
// size is known. The mapping is read-only and private: a file truncated by
// another process while open faults on access, as with safetensors itself.

namespace pipeforge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kResave = "re-save it with safetensors.torch.save_file or save_pretrained";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr std::size_t kMaxDims = 64;
// serde_json's recursion limit, which safetensors' own parser has.
constexpr std::size_t kMaxJsonDepth = 128;

struct DtypeInfo {
  const char* name;
  int bits;
};

// safetensors 0.8.0's Dtype enum, in its declaration order: the writer sorts
// by this rank, largest first (Note [Safetensors]).
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", 8},    {"F4", 4},          {"F6_E2M3", 6},     {"F6_E3M2", 6},
    {"U8", 8},      {"I8", 8},          {"F8_E5M2", 8},     {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
    {"U16", 16},    {"F16", 16},        {"BF16", 16},       {"I32", 32},
    {"U32", 32},    {"F32", 32},        {"C64", 64},        {"F64", 64},
    {"I64", 64},    {"U64", 64},
};

std::optional<std::size_t> dtypeRank(const std::string& name) {
  for (std::size_t i = 0; i < std::size(kDtypes); ++i) {
    if (name == kDtypes[i].name) return i;
  }
  return std::nullopt;
}

std::string dtypeList() {
  std::string out;
  for (const DtypeInfo& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

// Why `dtype` is not one: a lower-case spelling of a real name says so.
std::string unknownDtype(const std::string& dtype) {
  std::string upper = dtype;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper != dtype && dtypeRank(upper)) {
    return fmt::format("dtype \"{}\" is not a safetensors dtype: the names are upper case (\"{}\")", dtype, upper);
  }
  return fmt::format("dtype \"{}\" is not a safetensors dtype (the format has {})", dtype, dtypeList());
}

std::string shapeText(const std::vector<std::int64_t>& shape) {
  return "[" + fmt::format("{}", fmt::join(shape, ", ")) + "]";
}

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
  throw SafetensorsError("safetensors file '" + what + "': " + problem);
}

// numel x bits / 8 of a checked shape, or nullopt on overflow or a count of
// bits that does not end on a byte boundary (`*ragged` says which).
std::optional<std::uint64_t> byteSize(const std::vector<std::int64_t>& shape, int bits, std::uint64_t* numel_out,
                                      bool* ragged) {
  *ragged = false;
  std::uint64_t numel = 1;
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  if (empty) {
    numel = 0;
  } else {
    for (std::int64_t d : shape) {
      if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d), &numel)) return std::nullopt;
    }
  }
  if (numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
  std::uint64_t total_bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(bits), &total_bits)) return std::nullopt;
  if (numel_out) *numel_out = numel;
  if (total_bits % 8 != 0) {
    *ragged = true;
    return std::nullopt;
  }
  return total_bits / 8;
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string jsonReason(const json::exception& e) {
  std::string text = e.what();
  const auto close = text.find("] ");
  if (text.rfind("[json.exception.", 0) == 0 && close != std::string::npos) text = text.substr(close + 2);
  return text;
}

// Parses `text` as JSON, refusing a key twice in one object and nesting past
// kMaxJsonDepth (Note [Untrusted headers]). `duplicate(path, key)` returns the
// message for `key` repeated in the object reached by `path` (the keys of the
// enclosing objects, outermost first); `fail_with` throws every message.
using DuplicateMessage = std::function<std::string(const std::vector<std::string>& path, const std::string& key)>;

json parseStrictJson(const char* begin, const char* end, const std::function<void(const std::string&)>& fail_with,
                     const DuplicateMessage& duplicate) {
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (frames.size() >= kMaxJsonDepth) {
          fail_with(fmt::format("the JSON is nested deeper than {} levels", kMaxJsonDepth));
        }
        frames.push_back(Frame{event == json::parse_event_t::object_start, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        Frame& frame = frames.back();
        if (!frame.keys.insert(key).second) {
          std::vector<std::string> path;
          for (std::size_t i = 0; i + 1 < frames.size(); ++i) {
            if (frames[i].object) path.push_back(frames[i].last_key);
          }
          fail_with(duplicate(path, key));
        }
        frame.last_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail_with("it is not valid JSON: " + jsonReason(e));
  }
  return json();  // not reached: fail_with throws
}

// "the integer 3", "the number 1.5", "a string", "an array", "null": a value
// as a message names it.
std::string typeOf(const json& v) {
  if (v.is_number_integer()) return "the integer " + v.dump();
  if (v.is_number_float()) return "the number " + v.dump();
  if (v.is_null()) return "null";
  const std::string type = v.type_name();
  return (type == "array" || type == "object" ? "an " : "a ") + type;
}

// A JSON integer in [0, limit], or an explanation of why not.
std::optional<std::uint64_t> nonNegative(const json& v, std::uint64_t limit, std::string* why) {
  if (v.is_number_unsigned()) {
    const std::uint64_t value = v.get<std::uint64_t>();
    if (value <= limit) return value;
    *why = fmt::format("{} is too large", value);
    return std::nullopt;
  }
  if (v.is_number_integer()) {
    *why = fmt::format("{} is negative", v.get<std::int64_t>());
    return std::nullopt;
  }
  *why = (v.is_number() ? v.dump() : typeOf(v)) + " is not a whole number";
  return std::nullopt;
}

struct ParsedHeader {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // in data order
};

struct Range {
  std::uint64_t begin;
  std::uint64_t end;
};

// Every check of Note [Untrusted headers], on the file's whole bytes.
ParsedHeader parseHeader(const std::uint8_t* bytes, std::size_t size, const std::string& what) {
  if (size < 8) {
    fail(what, fmt::format("it holds {} bytes, fewer than the 8 of the header length that starts every safetensors "
                           "file: it is empty or cut short; download or copy it again, or {}",
                           size, kResave));
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > kMaxSafetensorsHeader) {
    fail(what, fmt::format("its first 8 bytes give a header of {} bytes, more than the format's limit of {} "
                           "(safetensors' MAX_HEADER_SIZE): it is not a safetensors file, or its start is damaged; {}",
                           n, kMaxSafetensorsHeader, kResave));
  }
  if (n > size - 8) {
    fail(what, fmt::format("its header is {} bytes long but the file holds only {} bytes after the length field: it "
                           "is cut short (an interrupted download or copy?); download or copy it again",
                           n, size - 8));
  }
  const char* header = reinterpret_cast<const char*>(bytes + 8);
  if (const void* nul = std::memchr(header, '\0', n)) {
    const auto at = static_cast<const char*>(nul) - header;
    fail(what, fmt::format("its header holds a NUL byte at header byte {} of {}: a header is padded with spaces, "
                           "never NUL bytes; {}",
                           at, n, kResave));
  }
  const auto fail_header = [&](const std::string& problem) { fail(what, "the header: " + problem + "; " + kResave); };
  const json root = parseStrictJson(
      header, header + n, fail_header, [](const std::vector<std::string>& path, const std::string& key) {
        if (path.empty()) {
          return key == "__metadata__" ? std::string("\"__metadata__\" appears twice")
                                       : fmt::format("tensor \"{}\" appears twice", key);
        }
        if (path.size() == 1 && path[0] == "__metadata__") {
          return fmt::format("__metadata__ has key \"{}\" twice", key);
        }
        return fmt::format("tensor \"{}\" has field \"{}\" twice", path[0], key);
      });
  if (!root.is_object()) fail_header(fmt::format("it is {}, not a JSON object", typeOf(root)));

  const std::uint64_t data_size = size - 8 - n;
  ParsedHeader out;
  std::vector<Range> ranges;
  for (const auto& item : root.items()) {
    // Named, not bound: a lambda below captures them (C++17 lambdas cannot capture structured bindings).
    const std::string& name = item.key();
    const json& entry = item.value();
    if (name == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object()) {
        fail_header(fmt::format("__metadata__ is {}, not an object of strings", typeOf(entry)));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          fail_header(fmt::format("__metadata__ key \"{}\" holds {}; metadata values are strings", key, typeOf(value)));
        }
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const auto bad = [&](const std::string& problem) {
      fail(what, fmt::format("tensor \"{}\": {}; {}", name, problem, kResave));
    };
    if (!entry.is_object()) bad(fmt::format("its entry is {}, not an object with dtype, shape and data_offsets", typeOf(entry)));
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) bad(fmt::format("its entry has no \"{}\"", field));
    }
    const json& dtype_json = entry["dtype"];
    if (!dtype_json.is_string()) bad(fmt::format("its dtype is {}, not a string such as \"F32\"", typeOf(dtype_json)));
    SafetensorsTensor tensor;
    tensor.name = name;
    tensor.dtype = dtype_json.get<std::string>();
    const auto rank = dtypeRank(tensor.dtype);
    if (!rank) bad(unknownDtype(tensor.dtype));

    const json& shape_json = entry["shape"];
    if (!shape_json.is_array()) bad(fmt::format("its shape is {}, not a list of dimensions", typeOf(shape_json)));
    if (shape_json.size() > kMaxDims) {
      bad(fmt::format("its shape has {} dimensions, more than the {} Pipeforge reads", shape_json.size(), kMaxDims));
    }
    for (std::size_t i = 0; i < shape_json.size(); ++i) {
      std::string why;
      const auto dim = nonNegative(shape_json[i], static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), &why);
      if (!dim) bad(fmt::format("dimension {} of its shape: {}; dimensions are non-negative integers", i, why));
      tensor.shape.push_back(static_cast<std::int64_t>(*dim));
    }

    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2) {
      bad(fmt::format("its data_offsets is {}, not a pair [begin, end]",
                      offsets.is_array() ? fmt::format("a list of {}", offsets.size()) : typeOf(offsets)));
    }
    Range range{};
    for (int i = 0; i < 2; ++i) {
      std::string why;
      const auto value = nonNegative(offsets[i], std::numeric_limits<std::uint64_t>::max(), &why);
      if (!value) bad(fmt::format("data_offsets {}: {}; offsets are non-negative integers", i == 0 ? "begin" : "end", why));
      (i == 0 ? range.begin : range.end) = *value;
    }
    if (range.begin > range.end) {
      bad(fmt::format("its data_offsets [{}, {}] begin after they end", range.begin, range.end));
    }
    bool ragged = false;
    const auto nbytes = byteSize(tensor.shape, kDtypes[*rank].bits, nullptr, &ragged);
    if (ragged) {
      bad(fmt::format("shape {} of {}-bit {} does not end on a byte boundary", shapeText(tensor.shape),
                      kDtypes[*rank].bits, tensor.dtype));
    }
    if (!nbytes) bad(fmt::format("shape {} of {} holds too many elements to count", shapeText(tensor.shape), tensor.dtype));
    if (*nbytes != range.end - range.begin) {
      bad(fmt::format("shape {} of {} takes {} bytes but its data_offsets [{}, {}] hold {}", shapeText(tensor.shape),
                      tensor.dtype, *nbytes, range.begin, range.end, range.end - range.begin));
    }
    tensor.nbytes = static_cast<std::size_t>(*nbytes);
    out.tensors.push_back(std::move(tensor));
    ranges.push_back(range);
  }

  // Data order: by offsets, then name (two empty tensors may share an offset).
  std::vector<std::size_t> order(out.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (ranges[a].begin != ranges[b].begin) return ranges[a].begin < ranges[b].begin;
    if (ranges[a].end != ranges[b].end) return ranges[a].end < ranges[b].end;
    return out.tensors[a].name < out.tensors[b].name;
  });
  std::uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (std::size_t i : order) {
    const Range& r = ranges[i];
    const std::string& name = out.tensors[i].name;
    if (r.begin > covered) {
      fail(what, previous ? fmt::format("tensor \"{}\" begins at data byte {} but \"{}\" before it ends at byte {}: "
                                        "bytes {}..{} belong to no tensor; {}",
                                        name, r.begin, previous->name, covered, covered, r.begin, kResave)
                          : fmt::format("its first tensor \"{}\" begins at data byte {}, not 0: bytes 0..{} belong "
                                        "to no tensor; {}",
                                        name, r.begin, r.begin, kResave));
    }
    if (r.begin < covered) {
      fail(what, fmt::format("tensor \"{}\" (data bytes {}..{}) overlaps \"{}\", which ends at byte {}: two tensors "
                             "may not share bytes; {}",
                             name, r.begin, r.end, previous->name, covered, kResave));
    }
    covered = r.end;
    previous = &out.tensors[i];
  }
  if (covered > data_size) {
    fail(what, fmt::format("tensor \"{}\" ends at data byte {} but the file holds only {} data bytes after its "
                           "header: it is cut short (an interrupted download or copy?); download or copy it again",
                           previous->name, covered, data_size));
  }
  if (covered < data_size) {
    fail(what, fmt::format("its tensors end at data byte {} but the file holds {} data bytes: {} trailing bytes "
                           "belong to no tensor; {}",
                           covered, data_size, data_size - covered, kResave));
  }

  // Every range is now inside the file (Note [Untrusted headers]).
  const std::uint8_t* data = bytes + 8 + n;
  std::vector<SafetensorsTensor> sorted;
  sorted.reserve(order.size());
  for (std::size_t i : order) {
    out.tensors[i].data = data + ranges[i].begin;
    out.tensors[i].file_offset = 8 + n + ranges[i].begin;
    sorted.push_back(std::move(out.tensors[i]));
  }
  out.tensors = std::move(sorted);
  return out;
}

// Closes a descriptor on every way out.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void failWrite(const std::string& path, int err) {
  throw Error(ErrorCode::kIo, fmt::format("cannot write '{}': {}", path, std::strerror(err)));
}

void writeAll(int fd, const void* data, std::size_t size, const std::string& path) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<std::size_t>(size, std::size_t{1} << 30));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failWrite(path, n < 0 ? errno : ENOSPC);
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// An entry checked for writing, with its dtype's rank (Note [Safetensors]).
struct Checked {
  const SafetensorsEntry* entry;
  std::size_t rank;
  std::uint64_t numel;
};

// The checks writeSafetensors documents, for every entry at once, so a bad
// one is refused before any file is written. `what` names the target.
std::vector<Checked> checkEntries(const std::vector<const SafetensorsEntry*>& entries, const std::string& what) {
  std::vector<Checked> out;
  std::set<std::string> names;
  for (const SafetensorsEntry* e : entries) {
    const auto bad = [&](const std::string& problem) {
      throw SafetensorsError(fmt::format("writing '{}': tensor \"{}\": {}", what, e->name, problem));
    };
    if (!names.insert(e->name).second) bad("the name is given twice; each tensor needs a name of its own");
    if (e->name == "__metadata__") bad("\"__metadata__\" is the format's metadata key, not a tensor name");
    const auto rank = dtypeRank(e->dtype);
    if (!rank) bad(unknownDtype(e->dtype));
    if (e->shape.size() > kMaxDims) bad(fmt::format("{} dimensions, more than {}", e->shape.size(), kMaxDims));
    for (std::int64_t d : e->shape) {
      if (d < 0) bad(fmt::format("shape {} has a negative dimension", shapeText(e->shape)));
    }
    bool ragged = false;
    std::uint64_t numel = 0;
    const auto nbytes = byteSize(e->shape, kDtypes[*rank].bits, &numel, &ragged);
    if (ragged) {
      bad(fmt::format("shape {} of {}-bit {} does not end on a byte boundary", shapeText(e->shape),
                      kDtypes[*rank].bits, e->dtype));
    }
    if (!nbytes) bad(fmt::format("shape {} holds too many elements to count", shapeText(e->shape)));
    if (*nbytes != e->nbytes) {
      bad(fmt::format("shape {} of {} takes {} bytes, but the entry gives {}", shapeText(e->shape), e->dtype, *nbytes,
                      e->nbytes));
    }
    PIPEFORGE_CHECK(e->nbytes == 0 || e->fill, "safetensors entry \"" + e->name + "\" has bytes but no fill");
    out.push_back(Checked{e, *rank, numel});
  }
  return out;
}

// One file from checked entries (Note [Safetensors]).
void writeChecked(const std::string& path, std::vector<Checked> entries,
                  const std::map<std::string, std::string>& metadata) {
  std::sort(entries.begin(), entries.end(), [](const Checked& a, const Checked& b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.entry->name < b.entry->name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  std::uint64_t offset = 0;
  for (const Checked& c : entries) {
    nlohmann::ordered_json tensor = nlohmann::ordered_json::object();
    tensor["dtype"] = c.entry->dtype;
    tensor["shape"] = c.entry->shape;
    tensor["data_offsets"] = {offset, offset + c.entry->nbytes};
    header[c.entry->name] = std::move(tensor);
    offset += c.entry->nbytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw SafetensorsError(fmt::format("writing '{}': a tensor name or metadata entry is not valid UTF-8 ({})", path,
                                       jsonReason(e)));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));

  AtomicFile file(path);
  FdCloser fd{::open(file.tempPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (fd.fd < 0) {
    throw Error(ErrorCode::kIo, fmt::format("cannot write '{}': {} (does the folder exist and is it writable?)", path,
                                            std::strerror(errno)));
  }
  writeAll(fd.fd, length, sizeof length, path);
  writeAll(fd.fd, text.data(), text.size(), path);
  for (const Checked& c : entries) {
    if (c.entry->nbytes == 0) continue;
    std::vector<std::uint8_t> bytes(c.entry->nbytes);
    c.entry->fill(bytes.data());
    writeAll(fd.fd, bytes.data(), bytes.size(), path);
  }
  const int closed = ::close(fd.fd);
  fd.fd = -1;
  if (closed != 0) failWrite(path, errno);
  file.commit();
}

std::vector<const SafetensorsEntry*> pointersTo(const std::vector<SafetensorsEntry>& entries) {
  std::vector<const SafetensorsEntry*> out;
  out.reserve(entries.size());
  for (const SafetensorsEntry& e : entries) out.push_back(&e);
  return out;
}

// "model-00002-of-00005.safetensors": a shard name of writeSafetensorsFolder.
bool isShardName(const std::string& name) {
  const std::string prefix = "model-", middle = "-of-", suffix = ".safetensors";
  if (name.size() != prefix.size() + 5 + middle.size() + 5 + suffix.size()) return false;
  const auto digits = [&](std::size_t at) {
    return std::all_of(name.begin() + at, name.begin() + at + 5, [](char c) { return c >= '0' && c <= '9'; });
  };
  return name.compare(0, prefix.size(), prefix) == 0 && digits(prefix.size()) &&
         name.compare(prefix.size() + 5, middle.size(), middle) == 0 && digits(prefix.size() + 5 + middle.size()) &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string readIndex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw SafetensorsError(fmt::format("cannot read the index '{}': {}", path, std::strerror(errno)),
                           errno == ENOENT ? ErrorCode::kUserInput : ErrorCode::kIo);
  }
  std::string text;
  char buffer[1 << 16];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxSafetensorsHeader) {
      throw SafetensorsError(fmt::format("the index '{}' is over {} bytes: it is not a model.safetensors.index.json; "
                                         "save the model again with save_pretrained",
                                         path, kMaxSafetensorsHeader));
    }
  }
  return text;
}

}  // namespace

std::optional<int> safetensorsDtypeBits(const std::string& dtype) {
  const auto rank = dtypeRank(dtype);
  if (!rank) return std::nullopt;
  return kDtypes[*rank].bits;
}

std::int64_t SafetensorsTensor::numel() const {
  // A zero first: the reader accepts [2^62, 2^62, 0], whose left-to-right
  // product would overflow before it reached the 0.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// --- SafetensorsFile ---------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::parse(const std::uint8_t* bytes, std::size_t size,
                                                        const std::string& what) {
  ParsedHeader parsed;
  try {
    parsed = parseHeader(bytes, size, what);
  } catch (const json::exception& e) {
    // Every value is type-checked before it is read; this only keeps the
    // contract (SafetensorsError, never nlohmann's) should a check miss.
    fail(what, "the header: " + jsonReason(e) + "; " + kResave);
  }
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = what;
  file->metadata_ = std::move(parsed.metadata);
  file->tensors_ = std::move(parsed.tensors);
  for (std::size_t i = 0; i < file->tensors_.size(); ++i) file->by_name_.emplace(file->tensors_[i].name, i);
  return file;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      throw SafetensorsError(fmt::format("no such safetensors file '{}'", path));
    }
    throw SafetensorsError(fmt::format("cannot open safetensors file '{}': {}", path, std::strerror(err)),
                           ErrorCode::kIo);
  }
  FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    throw SafetensorsError(fmt::format("cannot read safetensors file '{}': {}", path, std::strerror(errno)),
                           ErrorCode::kIo);
  }
  if (S_ISDIR(st.st_mode)) {
    throw SafetensorsError(fmt::format("'{}' is a folder, not a safetensors file; give the folder as a checkpoint "
                                       "source (SafetensorsSource) or name a .safetensors file in it",
                                       path));
  }
  if (!S_ISREG(st.st_mode)) {
    throw SafetensorsError(fmt::format("'{}' is not a regular file; give a .safetensors file", path));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size < 8) {
    // Too short to map or to be a safetensors file: parse says so.
    const std::uint8_t empty[8] = {};
    return parse(empty, size, path);
  }
  // Copy-on-write: a tensor made over these bytes (frontend/pt2_weights.cpp)
  // may be written to without touching the file.
  void* mapping = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (mapping == MAP_FAILED) {
    throw SafetensorsError(fmt::format("cannot map safetensors file '{}' ({} bytes): {}", path, size,
                                       std::strerror(errno)),
                           ErrorCode::kIo);
  }
  std::shared_ptr<SafetensorsFile> file;
  try {
    file = parse(static_cast<const std::uint8_t*>(mapping), size, path);
  } catch (...) {
    ::munmap(mapping, size);
    throw;
  }
  file->mapping_ = mapping;
  file->mapped_size_ = size;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapped_size_);
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

// --- SafetensorsSource ------------------------------------------------------------

SafetensorsSource SafetensorsSource::open(const std::string& path) {
  SafetensorsSource source;
  source.path_ = path;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) {
    throw SafetensorsError(fmt::format("no such file or folder '{}'; give a .safetensors file or a folder written "
                                       "by save_pretrained",
                                       path));
  }
  // Indexes every tensor of `file`; a name already indexed from another
  // shard is refused (Note [Untrusted headers]: no two names share bytes
  // within a file; across shards, which one would be meant?).
  const auto add = [&source](std::shared_ptr<SafetensorsFile> file) {
    const std::size_t at = source.files_.size();
    for (const SafetensorsTensor& t : file->tensors()) {
      const auto [it, fresh] = source.index_.emplace(t.name, std::make_pair(at, &t));
      if (!fresh) {
        throw SafetensorsError(fmt::format("'{}': tensor \"{}\" is in two shards, '{}' and '{}': the folder mixes "
                                           "files of two saves; save the model again into an empty folder",
                                           source.path_, t.name, source.files_[it->second.first]->path(),
                                           file->path()));
      }
    }
    source.files_.push_back(std::move(file));
  };
  const auto ends_with = [](const std::string& text, const std::string& tail) {
    return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::string index_path;
  if (!fs::is_directory(status)) {
    // The index itself names its folder's checkpoint.
    if (!ends_with(path, ".safetensors.index.json")) {
      add(SafetensorsFile::open(path));
      return source;
    }
    index_path = path;
  } else if (fs::exists(fs::path(path) / kSingleFile, ec)) {
    add(SafetensorsFile::open((fs::path(path) / kSingleFile).string()));
    return source;
  } else {
    index_path = (fs::path(path) / kIndexFile).string();
    if (!fs::exists(index_path, ec)) {
      throw SafetensorsError(fmt::format("folder '{}' holds neither {} nor {}; a folder written by save_pretrained "
                                         "holds one of them: give that folder, or a .safetensors file",
                                         path, kSingleFile, kIndexFile));
    }
  }
  const fs::path dir = fs::path(index_path).parent_path();
  const std::string text = readIndex(index_path);
  const auto bad = [&](const std::string& problem) {
    throw SafetensorsError(fmt::format("index '{}': {}", index_path, problem));
  };
  const json index = parseStrictJson(
      text.data(), text.data() + text.size(),
      [&](const std::string& problem) { bad(problem + "; save the model again with save_pretrained"); },
      [](const std::vector<std::string>& keys, const std::string& key) {
        if (keys.size() == 1 && keys[0] == "weight_map") return fmt::format("weight_map lists \"{}\" twice", key);
        std::string where;
        for (const std::string& k : keys) where += "." + k;
        return fmt::format("key \"{}\" appears twice in {}", key, where.empty() ? "the top object" : where.substr(1));
      });
  if (!index.is_object()) bad(fmt::format("it is {}, not a JSON object with \"weight_map\"", typeOf(index)));
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    bad("it has no \"weight_map\" object (name -> shard file); save the model again with save_pretrained");
  }
  const json& weight_map = index["weight_map"];

  // The shards, each opened once, in sorted order as transformers does.
  std::map<std::string, std::string> shard_of;  // tensor -> shard file name
  std::set<std::string> shards;
  for (const auto& [name, value] : weight_map.items()) {
    if (!value.is_string()) {
      bad(fmt::format("weight_map gives tensor \"{}\" {}, not a shard file name", name, typeOf(value)));
    }
    const std::string shard = value.get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos) {
      bad(fmt::format("weight_map puts tensor \"{}\" in \"{}\", which is not a file name inside the folder; shards "
                      "sit beside the index: fix the index or save the model again with save_pretrained",
                      name, shard));
    }
    shard_of[name] = shard;
    shards.insert(shard);
  }
  std::map<std::string, std::size_t> file_of_shard;
  for (const std::string& shard : shards) {
    const fs::path shard_path = dir / shard;
    if (!fs::exists(shard_path, ec)) {
      const auto listed = std::find_if(shard_of.begin(), shard_of.end(), [&](const auto& p) { return p.second == shard; });
      bad(fmt::format("shard '{}', which holds \"{}\", is not in folder '{}': copy or download every shard the index "
                      "lists",
                      shard, listed->first, dir.empty() ? std::string(".") : dir.string()));
    }
    file_of_shard[shard] = source.files_.size();
    add(SafetensorsFile::open(shard_path.string()));
  }
  for (const auto& [name, shard] : shard_of) {
    if (source.files_[file_of_shard[shard]]->find(name) == nullptr) {
      bad(fmt::format("weight_map puts \"{}\" in '{}', which has no tensor of that name: the index and its shards "
                      "are not from one save; download or save the model again",
                      name, shard));
    }
  }
  return source;
}

std::vector<std::string> SafetensorsSource::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& entry : index_) out.push_back(entry.first);
  return out;
}

const SafetensorsTensor* SafetensorsSource::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.second;
}

std::string SafetensorsSource::fileOf(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? std::string() : files_[it->second.first]->path();
}

std::uint64_t SafetensorsSource::totalBytes() const {
  std::uint64_t total = 0;
  for (const auto& entry : index_) total += entry.second.second->nbytes;
  return total;
}

std::map<std::string, std::string> SafetensorsSource::metadata() const {
  std::map<std::string, std::string> merged;
  for (const auto& file : files_) {
    for (const auto& [key, value] : file->metadata()) merged.emplace(key, value);
  }
  return merged;
}

// --- writers ----------------------------------------------------------------------

void writeSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                      const std::map<std::string, std::string>& metadata) {
  writeChecked(path, checkEntries(pointersTo(entries), path), metadata);
}

std::vector<std::string> writeSafetensorsFolder(const std::string& dir, const std::vector<SafetensorsEntry>& entries,
                                                std::uint64_t max_shard_bytes) {
  const std::vector<Checked> checked = checkEntries(pointersTo(entries), dir);
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw SafetensorsError(fmt::format("cannot write a checkpoint folder at '{}': it is a file; give a folder", dir));
  }
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, fmt::format("cannot create folder '{}': {}", dir, ec.message()));

  // huggingface_hub's split_state_dict_into_shards_factory: a tensor over the
  // limit is a shard at once (before the one being filled); otherwise a shard
  // closes when the next tensor would pass the limit.
  std::vector<std::vector<Checked>> shards;
  std::vector<Checked> current;
  std::uint64_t current_bytes = 0;
  for (const Checked& c : checked) {
    const std::uint64_t size = c.entry->nbytes;
    if (size > max_shard_bytes) {
      shards.push_back({c});
      continue;
    }
    if (current_bytes + size > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(c);
    current_bytes += size;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  const fs::path folder(dir);
  const bool sharded = shards.size() > 1;
  std::vector<std::string> written;
  std::set<std::string> written_names;
  json weight_map = json::object();
  std::uint64_t total_size = 0, total_parameters = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        sharded ? fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size()) : std::string(kSingleFile);
    const std::string path = (folder / name).string();
    for (const Checked& c : shards[i]) {
      weight_map[c.entry->name] = name;
      total_size += c.entry->nbytes;
      total_parameters += c.numel;
    }
    writeChecked(path, shards[i], {{"format", "pt"}});
    written.push_back(path);
    written_names.insert(name);
  }
  if (sharded) {
    json index = json::object();
    index["metadata"] = {{"total_parameters", total_parameters}, {"total_size", total_size}};
    index["weight_map"] = std::move(weight_map);
    const std::string path = (folder / kIndexFile).string();
    // As json.dumps(index, indent=2, sort_keys=True) + "\n" writes it.
    writeFileAtomically(path, index.dump(2, ' ', /*ensure_ascii=*/true) + "\n");
    written.push_back(path);
    written_names.insert(kIndexFile);
  }

  // Files of an earlier save that a reader would take for this one's (Note [Safetensors]).
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    if (written_names.count(name) || !entry.is_regular_file(ec)) continue;
    if (isShardName(name) || name == kSingleFile || name == kIndexFile) {
      if (!fs::remove(entry.path(), ec) && ec) {
        throw Error(ErrorCode::kIo, fmt::format("wrote the checkpoint into '{}' but cannot remove '{}' of an earlier "
                                                "save ({}); remove it by hand, or readers may load it",
                                                dir, name, ec.message()));
      }
    }
  }
  return written;
}

}  // namespace pipeforge
