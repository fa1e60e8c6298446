// Reading and writing safetensors, the format transformers' save_pretrained
// writes (one `model.safetensors`, or shards listed by
// `model.safetensors.index.json`). Torch-free: tensors are named byte ranges
// of a read-only mapping, with a dtype name and a shape; callers convert.
//
// Format (Note [Safetensors]): 8 bytes little-endian N, N bytes of JSON
// header {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
// "data_offsets": [begin, end]}}, then the data; offsets are relative to
// byte 8 + N. The header is untrusted input: everything in it is checked
// before any byte it points at is handed out (Note [Untrusted headers]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace pipeforge {

class SafetensorsError : public Error {
 public:
  explicit SafetensorsError(const std::string& message, ErrorCode code = ErrorCode::kUserInput)
      : Error(code, message) {}
};

// The largest header read (safetensors' own MAX_HEADER_SIZE).
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

// A dtype name of the format ("F32", "BF16", ...) and its element size in
// bits (F4: 4, F6_*: 6); nullopt for a name the format does not have.
std::optional<int> safetensorsDtypeBits(const std::string& dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;                 // "F32", "BF16", ...
  std::vector<std::int64_t> shape;   // [] is a scalar
  const std::uint8_t* data = nullptr;  // into the mapping; valid while the file is open
  std::size_t nbytes = 0;
  std::uint64_t file_offset = 0;       // where `data` lies in its file
  std::int64_t numel() const;
};

// One .safetensors file, mapped read-only.
class SafetensorsFile {
 public:
  // Maps and checks `path`; throws SafetensorsError naming the file and the
  // problem (a header too large or cut short, not a JSON object, an unknown
  // dtype, a negative dimension, a byte size that is not numel x itemsize,
  // offsets that overlap, leave gaps or reach past the end, a repeated name).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  // The same checks on bytes in memory (the fuzz target); `what` names them
  // in messages. The bytes must outlive the object.
  static std::shared_ptr<SafetensorsFile> parse(const std::uint8_t* bytes, std::size_t size, const std::string& what);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // In data order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  std::size_t mapped_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::size_t> by_name_;
};

// Every tensor of a checkpoint: one .safetensors file, or a folder holding
// `model.safetensors` or `model.safetensors.index.json` and its shards (or
// that index file itself: a path ending in ".safetensors.index.json"). Of an
// index, every tensor of every shard it lists is indexed, listed or not, as
// transformers reads them.
class SafetensorsSource {
 public:
  // Throws SafetensorsError: no such file or folder, a folder with neither
  // file, an index that is not JSON or lacks "weight_map", a shard it names
  // that is missing or lacks a tensor the index puts there, a name in two
  // shards, a shard outside the folder ("../x").
  static SafetensorsSource open(const std::string& path);

  const std::string& path() const { return path_; }
  // Sorted.
  std::vector<std::string> names() const;
  // nullptr when absent. Valid while this source lives.
  const SafetensorsTensor* find(const std::string& name) const;
  // The file that holds `name` (for messages); "" when absent.
  std::string fileOf(const std::string& name) const;
  // Sum of every tensor's bytes.
  std::uint64_t totalBytes() const;
  // Every file's __metadata__, merged (the first file's value of a key wins).
  std::map<std::string, std::string> metadata() const;

 private:
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<std::size_t, const SafetensorsTensor*>> index_;
};

// One tensor to write: its bytes come from `fill`, called once, with a buffer
// of exactly `nbytes` (so a writer holds one tensor at a time).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::size_t nbytes = 0;
  std::function<void(std::uint8_t* out)> fill;
};

// Writes one file as the safetensors writer does, byte for byte: the header
// padded with spaces to a multiple of 8 (`__metadata__` left out when
// `metadata` is empty), tensors ordered by dtype alignment (largest first, in
// safetensors' own dtype order: Note [Safetensors]) then name, packed back to
// back; written atomically (a temporary sibling, fsync, rename), holding one
// tensor's bytes in memory at a time. Throws SafetensorsError on a bad entry (unknown
// dtype, nbytes not numel x itemsize, a repeated name) and Error(kIo) when
// the file system refuses.
void writeSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes what save_pretrained writes into `dir`: `model.safetensors` when
// everything fits in `max_shard_bytes`, else shards
// `model-00001-of-0000N.safetensors` filled greedily in the given order (a
// shard closes when the next tensor would pass the limit; a tensor larger
// than the limit gets its own) and `model.safetensors.index.json`
// ({"metadata": {"total_parameters": P, "total_size": B}, "weight_map":
// {name: file}}, sorted keys, indent 2). Old shards of another count are
// removed, and so is a stale index (when writing one file) or a stale
// `model.safetensors` (when writing shards), which readers would otherwise
// take for this save. Creates `dir` if missing. Returns the files written
// (paths: the shards in order, then the index).
std::vector<std::string> writeSafetensorsFolder(const std::string& dir, const std::vector<SafetensorsEntry>& entries,
                                                std::uint64_t max_shard_bytes);

}  // namespace pipeforge
