// PyTorch's zip container (what torch.save and torch.export.save write),
// without LibTorch: the central directory of an archive, and a writer that
// streams records at the disk's speed (Note [Stage files at the disk's speed]).
//
// Note [Stage files at the disk's speed]: a split copies most of a model's
// bytes from the .pt2 (or the safetensors checkpoint) into stage files, so
// its floor is `cp` of those bytes. LibTorch's PyTorchStreamWriter reads each
// record into memory first, computes its CRC-32 again, and the split then
// read every stage file back to hash it with SHA-256: three passes over the
// bytes besides the copy (issue 41 measured 6-7x `cp`). TorchZipWriter makes
// it one, and as cheap as cp's:
//   - a record whose bytes lie in a file (a record of the source .pt2, a
//     same-dtype tensor of a safetensors checkpoint) is copied file to file
//     in the kernel (copy_file_range, as cp copies; write() where the file
//     systems cannot), and a record of the .pt2 keeps the CRC-32 its central
//     directory gives (the bytes are the same);
//   - the file's XXH3-128 digest (Note [File digests] in stage/file_digest.h:
//     SHA-256 alone ran slower than the disk), and the CRC-32 of a record
//     that has none, are computed on a second core from the source's mapping
//     (its page tables filled per chunk, MADV_POPULATE_READ) while the first
//     copies the same chunk;
//   - meanwhile the first core hands the chunk just written to the disk
//     (sync_file_range, not waiting), so the fsync that commits the split
//     finds the files written, where it used to wait for all of them;
//   - pages of a mapped source are dropped from the process once hashed
//     (MADV_DONTNEED: they stay in the page cache), so peak RSS holds one
//     chunk of them, not the file. A tensor converted to another dtype is
//     made a chunk at a time, never whole.
// Measured on the 2-core CI machine (bench/streaming_split.py), GPT-2 355M
// in 4 stages: 7.8 s with PyTorchStreamWriter and SHA-256, 1.6 s now, of
// which 0.65 s is starting up (LibTorch, the program); `cp` takes 0.95 s.
// The layout is PyTorchStreamWriter's byte for byte (tests/common/
// torch_zip_test.cpp compares them): stored records under "<root>/", each
// record's data 64-byte aligned by an "FB" extra field padded with 'Z', a
// data descriptor after each, zip64 end records, and the closing records
// `.data/version`, `byteorder` and `.data/serialization_id`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace pipeforge {

class ZipError : public Error {
 public:
  explicit ZipError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

// One record of an archive, as its central directory and local header give it.
struct ZipRecord {
  std::string name;          // full name, "<root>/data/weights/weight_0"
  std::uint64_t data_offset = 0;  // the record's first byte in the file
  std::uint64_t size = 0;         // uncompressed size
  std::uint64_t compressed_size = 0;
  std::uint32_t crc32 = 0;
  std::uint16_t method = 0;       // 0: stored
};

// The records of the zip archive in `bytes` (a whole file, mapped), in
// directory order. Throws ZipError naming `what` when the directory is
// missing, truncated or points outside the file.
std::vector<ZipRecord> readZipDirectory(const void* bytes, std::size_t size, const std::string& what);

// Drops the whole pages inside [data, data + size) from the process
// (MADV_DONTNEED). Only for a read-only or unmodified file mapping: the
// pages stay in the page cache and read back the same; a page of anonymous
// memory would read back as zeros.
void dropMappedPages(const void* data, std::size_t size);

class TorchZipWriter {
 public:
  // Creates (truncates) `path`; records are stored under "<root>/".
  // Throws Error(kIo) when the file cannot be created.
  // `zip64_from`: a record this large, or starting this far in, gets zip64
  // fields (above 4 GiB; tests lower it to check the format on small files).
  TorchZipWriter(const std::string& path, std::string root, std::uint64_t zip64_from = 0xFFFFFFFFu);
  ~TorchZipWriter();
  TorchZipWriter(const TorchZipWriter&) = delete;
  TorchZipWriter& operator=(const TorchZipWriter&) = delete;

  // How `add` treats the source's pages once they are written.
  enum class Pages { kKeep, kDropMapped };

  // Appends record `name` (relative to the root). `crc32` is the bytes'
  // CRC-32 when known (copied from another archive); it is computed
  // otherwise. kDropMapped: `data` lies in a read-only or unmodified
  // file mapping whose pages may be dropped (MADV_DONTNEED) once written.
  void add(const std::string& name, const void* data, std::size_t size, std::optional<std::uint32_t> crc32 = {},
           Pages pages = Pages::kKeep);
  void add(const std::string& name, std::string_view text) { add(name, text.data(), text.size()); }

  // Appends record `name` of `size` bytes made as it is written, one chunk
  // at a time: `fill(offset, n, out)` puts bytes [offset, offset + n) into
  // `out` (a converted tensor is then never whole in memory).
  using Fill = std::function<void(std::size_t offset, std::size_t n, void* out)>;
  void add(const std::string& name, std::size_t size, const Fill& fill);

  // Appends record `name`: `size` bytes of the file open as `source_fd`, from
  // `offset`, copied in the kernel (copy_file_range, as cp copies; write()
  // where the file systems cannot). The digest reads them from `mapped`
  // (the same bytes in a read-only or unmodified mapping of that file; its
  // pages are dropped once hashed), else into a buffer of its own (pread).
  void addFromFile(const std::string& name, int source_fd, std::uint64_t offset, std::size_t size,
                   std::optional<std::uint32_t> crc32 = {}, const void* mapped = nullptr);

  // Writes the closing records (`.data/version` holds `version`), the
  // central directory and the end records, closes the file and returns its
  // XXH3-128 digest (common/xxh3.h). Throws Error(kIo) on a failed write.
  std::string finish(int version);

  std::uint64_t bytesWritten() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipeforge
