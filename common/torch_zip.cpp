#include "common/torch_zip.h"

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // copy_file_range, sync_file_range
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/xxh3.h"

namespace pipeforge {

namespace {

constexpr std::uint32_t kLocalHeader = 0x04034b50;
constexpr std::uint32_t kDataDescriptor = 0x08074b50;
constexpr std::uint32_t kCentralHeader = 0x02014b50;
constexpr std::uint32_t kZip64End = 0x06064b50;
constexpr std::uint32_t kZip64Locator = 0x07064b50;
constexpr std::uint32_t kEnd = 0x06054b50;
constexpr std::uint16_t kFlags = 0x0808;  // sizes in a data descriptor; UTF-8 names
constexpr std::uint16_t kEmptyFlags = 0x0800;  // an empty record: no descriptor, as miniz writes it
constexpr std::uint64_t k32 = 0xFFFFFFFFu;
constexpr std::size_t kAlignment = 64;    // PyTorch's kFieldAlignment
constexpr std::size_t kChunk = 8u << 20;  // bytes written (and hashed) per step

std::uint16_t le16(const unsigned char* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
std::uint32_t le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
std::uint64_t le64(const unsigned char* p) {
  return static_cast<std::uint64_t>(le32(p)) | (static_cast<std::uint64_t>(le32(p + 4)) << 32);
}

void put16(std::string& out, std::uint16_t v) {
  out += static_cast<char>(v & 0xFF);
  out += static_cast<char>(v >> 8);
}
void put32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}
void put64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

// Hashes chunks on a second thread while the caller writes them: post() one,
// write it, wait() for it, in order, so the digest sees the file's bytes in
// file order.
class ChunkHasher {
 public:
  ChunkHasher() {
    thread_ = std::thread([this] { run(); });
  }
  ~ChunkHasher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  // Hashes `size` bytes on this thread (small pieces: headers); the worker is idle.
  void hereAndNow(const void* data, std::size_t size) { digest_.update(data, size); }

  void post(const void* data, std::size_t size, std::uint32_t* crc) {
    start(static_cast<const unsigned char*>(data), -1, 0, size, crc, false);
  }
  // The same for bytes of a file mapping: their page tables are filled in
  // one call (MADV_POPULATE_READ), not a fault per few pages.
  void postMapped(const void* data, std::size_t size, std::uint32_t* crc) {
    start(static_cast<const unsigned char*>(data), -1, 0, size, crc, true);
  }
  // The same for `size` bytes of file `fd` from `offset`, read (pread) into
  // the worker's own buffer: no page of a mapping is touched.
  void postFile(int fd, std::uint64_t offset, std::size_t size, std::uint32_t* crc) {
    start(nullptr, fd, offset, size, crc, false);
  }
  // Waits for the chunk; returns 0, or the errno of a failed read.
  int wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return !busy_; });
    return error_;
  }

  std::string hex() const { return digest_.hex(); }
  // 40 decimal digits from the digest of the bytes so far (the file's
  // serialization id: PyTorch's is 40 digits too).
  std::string digitsSoFar() const {
    const std::string h = digest_.hex();
    char text[41];
    std::snprintf(text, sizeof text, "%020llu%020llu",
                  std::stoull(h.substr(0, 16), nullptr, 16) % 10000000000000000000ull,
                  std::stoull(h.substr(16, 16), nullptr, 16) % 10000000000000000000ull);
    return text;
  }

 private:
  void start(const unsigned char* data, int fd, std::uint64_t offset, std::size_t size, std::uint32_t* crc,
             bool populate) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      data_ = data;
      fd_ = fd;
      offset_ = offset;
      size_ = size;
      crc_ = crc;
      populate_ = populate;
      error_ = 0;
      busy_ = true;
    }
    cv_.notify_all();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || busy_; });
      if (stop_) return;
      lock.unlock();
      const unsigned char* data = data_;
      if (fd_ >= 0) data = readChunk();
#ifdef MADV_POPULATE_READ
      if (populate_) {
        static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        const auto begin = reinterpret_cast<std::uintptr_t>(data) / page * page;
        const auto end = reinterpret_cast<std::uintptr_t>(data) + size_;
        ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);  // best effort
      }
#endif
      if (data != nullptr) {
        digest_.update(data, size_);
        if (crc_ != nullptr) *crc_ = static_cast<std::uint32_t>(crc32_z(*crc_, data, size_));
      }
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  const unsigned char* readChunk() {
    buffer_.resize(std::max(buffer_.size(), size_));
    for (std::size_t done = 0; done < size_;) {
      const ssize_t n = ::pread(fd_, buffer_.data() + done, size_ - done, static_cast<off_t>(offset_ + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = n < 0 ? errno : EIO;  // a source that shrank: EIO
        return nullptr;
      }
      done += static_cast<std::size_t>(n);
    }
    return buffer_.data();
  }

  Xxh3Digest digest_;
  std::vector<unsigned char> buffer_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable cv_;
  const unsigned char* data_ = nullptr;
  int fd_ = -1;
  std::uint64_t offset_ = 0;
  int error_ = 0;
  bool populate_ = false;
  std::size_t size_ = 0;
  std::uint32_t* crc_ = nullptr;
  bool busy_ = false;
  bool stop_ = false;
};

struct Written {
  std::string name;
  std::uint64_t header_offset = 0;
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};

}  // namespace

std::vector<ZipRecord> readZipDirectory(const void* bytes, std::size_t size, const std::string& what) {
  const auto* base = static_cast<const unsigned char*>(bytes);
  auto broken = [&](const std::string& why) {
    return ZipError("'" + what + "' is not a readable zip archive (" + why +
                    "); it may be truncated or corrupt: export or copy it again");
  };
  if (size < 22) throw broken("shorter than a zip's end record");
  // The end record: the last signature within the comment's reach.
  std::size_t end = size - 22;
  const std::size_t lowest = size >= 22 + 0xFFFF ? size - 22 - 0xFFFF : 0;
  while (le32(base + end) != kEnd) {
    if (end == lowest) throw broken("no end-of-central-directory record");
    --end;
  }
  std::uint64_t count = le16(base + end + 10);
  std::uint64_t dir_size = le32(base + end + 12);
  std::uint64_t dir_offset = le32(base + end + 16);
  if (end >= 20 && le32(base + end - 20) == kZip64Locator) {
    const std::uint64_t z64 = le64(base + end - 20 + 8);
    if (z64 > size || size - z64 < 56 || le32(base + z64) != kZip64End) throw broken("a bad zip64 end record");
    count = le64(base + z64 + 32);
    dir_size = le64(base + z64 + 40);
    dir_offset = le64(base + z64 + 48);
  }
  if (dir_offset > size || dir_size > size - dir_offset) throw broken("its central directory lies outside the file");
  std::vector<ZipRecord> records;
  records.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(count, dir_size / 46 + 1)));
  std::uint64_t at = dir_offset;
  const std::uint64_t dir_end = dir_offset + dir_size;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (dir_end - at < 46 || le32(base + at) != kCentralHeader) throw broken("a bad central directory entry");
    const unsigned char* h = base + at;
    ZipRecord r;
    r.method = le16(h + 10);
    r.crc32 = le32(h + 16);
    r.compressed_size = le32(h + 20);
    r.size = le32(h + 24);
    const std::uint64_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
    std::uint64_t header_offset = le32(h + 42);
    if (dir_end - at - 46 < name_len + extra_len + comment_len) throw broken("a central directory entry overruns it");
    r.name.assign(reinterpret_cast<const char*>(h + 46), name_len);
    // The zip64 extra field holds, in order, the fields that read 0xFFFFFFFF.
    const unsigned char* extra = h + 46 + name_len;
    for (std::uint64_t e = 0; e + 4 <= extra_len;) {
      const std::uint16_t id = le16(extra + e), len = le16(extra + e + 2);
      if (e + 4 + len > extra_len) throw broken("a bad extra field in '" + r.name + "'");
      if (id == 1) {
        const unsigned char* f = extra + e + 4;
        std::uint64_t left = len;
        auto next = [&](std::uint64_t& field) {
          if (field != k32) return;
          if (left < 8) throw broken("a short zip64 field in '" + r.name + "'");
          field = le64(f);
          f += 8;
          left -= 8;
        };
        next(r.size);
        next(r.compressed_size);
        next(header_offset);
      }
      e += 4 + len;
    }
    if (header_offset > size || size - header_offset < 30 || le32(base + header_offset) != kLocalHeader) {
      throw broken("the local header of '" + r.name + "' lies outside the file");
    }
    const unsigned char* local = base + header_offset;
    r.data_offset = header_offset + 30 + le16(local + 26) + le16(local + 28);
    if (r.data_offset > size || size - r.data_offset < r.compressed_size) {
      throw broken("the bytes of '" + r.name + "' lie outside the file");
    }
    records.push_back(std::move(r));
    at += 46 + name_len + extra_len + comment_len;
  }
  return records;
}

void dropMappedPages(const void* data, std::size_t size) {
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t first = (begin + page - 1) / page * page, last = (begin + size) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

struct TorchZipWriter::Impl {
  std::string path;
  std::string root;
  int fd = -1;
  std::uint64_t offset = 0;
  std::uint64_t zip64_from = k32;
  std::vector<Written> written;
  ChunkHasher hasher;

  [[noreturn]] void fail(const std::string& doing, int err) const {
    throw Error(ErrorCode::kIo, "cannot " + doing + " '" + path + "': " + std::strerror(err) +
                                    (err == ENOSPC ? " (free space on that disk, or write elsewhere)" : ""));
  }

  void writeAll(const void* data, std::size_t size) {
    const auto* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::write(fd, p, std::min<std::size_t>(size, 1u << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write", errno);
      }
      p += n;
      size -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
  }
  // The bytes [offset, offset + n) of a record, and what to do once they
  // are written.
  using Chunks = std::function<std::pair<const unsigned char*, std::function<void()>>(std::size_t offset,
                                                                                       std::size_t n)>;
  // Where a record's bytes come from: memory, chunk by chunk (`chunk`), or
  // file `source_fd` from `source_offset`.
  struct Source {
    Chunks chunk;
    int source_fd = -1;
    std::uint64_t source_offset = 0;
    const unsigned char* mapped = nullptr;  // the same bytes, mapped: hashed from there
  };
  void addRecord(const std::string& name, std::size_t size, std::optional<std::uint32_t> crc32, const Source& from);
  // Copies n bytes of `fd` from `offset` to the end of this file in the
  // kernel (copy_file_range, as cp does); false when the file systems cannot,
  // and nothing was copied.
  bool copyFromFile(int fd, std::uint64_t offset, std::size_t n);
  bool copy_file_range_works = true;

  // Small pieces (headers, descriptors): hashed here, the worker being idle.
  void writeSmall(const std::string& bytes) {
    hasher.hereAndNow(bytes.data(), bytes.size());
    writeAll(bytes.data(), bytes.size());
  }
};

TorchZipWriter::TorchZipWriter(const std::string& path, std::string root, std::uint64_t zip64_from)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->zip64_from = std::min<std::uint64_t>(zip64_from, k32);
  impl_->root = std::move(root);
  impl_->fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (impl_->fd < 0) impl_->fail("create", errno);
}

TorchZipWriter::~TorchZipWriter() {
  if (impl_ && impl_->fd >= 0) ::close(impl_->fd);
}

std::uint64_t TorchZipWriter::bytesWritten() const { return impl_->offset; }

void TorchZipWriter::add(const std::string& name, const void* data, std::size_t size,
                         std::optional<std::uint32_t> crc32, Pages pages) {
  Impl::Source from;
  from.chunk = [&](std::size_t offset, std::size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data) + offset;
    return std::make_pair(bytes, std::function<void()>([bytes, n, pages] {
                            if (pages == Pages::kDropMapped) dropMappedPages(bytes, n);
                          }));
  };
  impl_->addRecord(name, size, crc32, from);
}

void TorchZipWriter::addFromFile(const std::string& name, int source_fd, std::uint64_t offset, std::size_t size,
                                 std::optional<std::uint32_t> crc32, const void* mapped) {
  Impl::Source from;
  from.source_fd = source_fd;
  from.source_offset = offset;
  from.mapped = static_cast<const unsigned char*>(mapped);
  impl_->addRecord(name, size, crc32, from);
}

bool TorchZipWriter::Impl::copyFromFile(int source, std::uint64_t offset, std::size_t n) {
  if (!copy_file_range_works) return false;
  auto in = static_cast<loff_t>(offset);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t copied = ::copy_file_range(source, &in, fd, nullptr, n - done, 0);
    if (copied < 0 && errno == EINTR) continue;
    if (copied < 0 && done == 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
      copy_file_range_works = false;  // another file system: write() from here on
      return false;
    }
    if (copied < 0) fail("write", errno);
    if (copied == 0) fail("copy into", EIO);  // the source is shorter than its directory says
    done += static_cast<std::size_t>(copied);
    this->offset += static_cast<std::uint64_t>(copied);
  }
  return true;
}

void TorchZipWriter::add(const std::string& name, std::size_t size, const Fill& fill) {
  std::vector<unsigned char> buffer(std::min(kChunk, size));
  Impl::Source from;
  from.chunk = [&](std::size_t offset, std::size_t n) {
    fill(offset, n, buffer.data());
    return std::make_pair(static_cast<const unsigned char*>(buffer.data()), std::function<void()>([] {}));
  };
  impl_->addRecord(name, size, std::nullopt, from);
}

void TorchZipWriter::Impl::addRecord(const std::string& name, std::size_t size, std::optional<std::uint32_t> crc32,
                                     const Source& from) {
  Impl& z = *this;
  if (z.fd < 0) throw Error(ErrorCode::kInternal, "TorchZipWriter::add after finish");
  const std::string full = z.root + "/" + name;
  if (full.size() > 0xFFFF) throw ZipError("record name too long for a zip: '" + full.substr(0, 80) + "...'");
  Written record{full, z.offset, size, 0};

  // The local header; sizes and CRC follow the data in its descriptor.
  const std::size_t unpadded = z.offset + 30 + full.size() + 4;
  const std::size_t padding = (kAlignment - unpadded % kAlignment) % kAlignment;
  std::string header;
  put32(header, kLocalHeader);
  put16(header, 0);       // version needed
  put16(header, size == 0 ? kEmptyFlags : kFlags);
  put16(header, 0);       // stored
  put16(header, 0);       // time
  put16(header, 0);       // date
  put32(header, 0);       // CRC-32: in the descriptor
  put32(header, 0);       // sizes: in the descriptor
  put32(header, 0);
  put16(header, static_cast<std::uint16_t>(full.size()));
  put16(header, static_cast<std::uint16_t>(4 + padding));
  header += full;
  header += "FB";
  put16(header, static_cast<std::uint16_t>(padding));
  header.append(padding, 'Z');
  z.writeSmall(header);

  std::uint32_t crc = crc32.value_or(0);
  std::uint32_t* computing = crc32 ? nullptr : &crc;
  std::vector<unsigned char> fallback;  // a source file copy_file_range cannot copy from
  for (std::size_t done = 0; done < size;) {
    const std::size_t n = std::min(kChunk, size - done);
    if (from.source_fd >= 0) {
      const std::uint64_t at = from.source_offset + done;
      if (from.mapped != nullptr) {
        z.hasher.postMapped(from.mapped + done, n, computing);
      } else {
        z.hasher.postFile(from.source_fd, at, n, computing);
      }
      try {
        if (!z.copyFromFile(from.source_fd, at, n)) {
          fallback.resize(n);
          for (std::size_t got = 0; got < n;) {
            const ssize_t r = ::pread(from.source_fd, fallback.data() + got, n - got, static_cast<off_t>(at + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) z.fail("read the source of", r < 0 ? errno : EIO);
            got += static_cast<std::size_t>(r);
          }
          z.writeAll(fallback.data(), n);
        }
        // While the second core hashes, this one hands the chunk to the disk
        // (without waiting for it), rather than leaving it all for the fsync
        // that commits the folder.
        ::sync_file_range(z.fd, static_cast<off64_t>(z.offset - n), static_cast<off64_t>(n), SYNC_FILE_RANGE_WRITE);
      } catch (...) {
        z.hasher.wait();
        throw;
      }
      if (const int err = z.hasher.wait()) z.fail("read the source of", err);
      if (from.mapped != nullptr) dropMappedPages(from.mapped + done, n);
    } else {
      auto [bytes, after] = from.chunk(done, n);
      z.hasher.post(bytes, n, computing);
      try {
        z.writeAll(bytes, n);
        ::sync_file_range(z.fd, static_cast<off64_t>(z.offset - n), static_cast<off64_t>(n), SYNC_FILE_RANGE_WRITE);
      } catch (...) {
        z.hasher.wait();
        throw;
      }
      z.hasher.wait();
      after();
    }
    done += n;
  }
  record.crc32 = crc;
  if (size == 0) {
    z.written.push_back(std::move(record));
    return;
  }

  std::string descriptor;
  put32(descriptor, kDataDescriptor);
  put32(descriptor, crc);
  if (size >= z.zip64_from) {
    put64(descriptor, size);
    put64(descriptor, size);
  } else {
    put32(descriptor, static_cast<std::uint32_t>(size));
    put32(descriptor, static_cast<std::uint32_t>(size));
  }
  z.writeSmall(descriptor);
  z.written.push_back(std::move(record));
}

std::string TorchZipWriter::finish(int version) {
  Impl& z = *impl_;
  add(".data/version", std::to_string(version) + "\n");
  add("byteorder", "little");
  add(".data/serialization_id", z.hasher.digitsSoFar());

  const std::uint64_t dir_offset = z.offset;
  std::string dir;
  for (const Written& r : z.written) {
    std::string extra;
    const bool big = r.size >= z.zip64_from, far = r.header_offset >= z.zip64_from;
    if (big) {
      put64(extra, r.size);
      put64(extra, r.size);
    }
    if (far) put64(extra, r.header_offset);
    if (!extra.empty()) {
      std::string field;
      put16(field, 1);
      put16(field, static_cast<std::uint16_t>(extra.size()));
      extra = field + extra;
    }
    put32(dir, kCentralHeader);
    put16(dir, 0);                    // made by
    put16(dir, extra.empty() ? 0 : 45);  // version needed: 4.5 for zip64
    put16(dir, r.size == 0 ? kEmptyFlags : kFlags);
    put16(dir, 0);  // stored
    put16(dir, 0);  // time
    put16(dir, 0);  // date
    put32(dir, r.crc32);
    put32(dir, static_cast<std::uint32_t>(big ? k32 : r.size));
    put32(dir, static_cast<std::uint32_t>(big ? k32 : r.size));
    put16(dir, static_cast<std::uint16_t>(r.name.size()));
    put16(dir, static_cast<std::uint16_t>(extra.size()));
    put16(dir, 0);  // comment
    put16(dir, 0);  // disk
    put16(dir, 0);  // internal attributes
    put32(dir, 0);  // external attributes
    put32(dir, static_cast<std::uint32_t>(far ? k32 : r.header_offset));
    dir += r.name;
    dir += extra;
  }
  const std::uint64_t dir_size = dir.size();
  const std::uint64_t zip64_end = dir_offset + dir_size;
  const std::uint64_t count = z.written.size();
  put32(dir, kZip64End);
  put64(dir, 44);      // the record's size after this field
  put16(dir, 0x031e);  // made by: unix, 3.0
  put16(dir, 45);      // needed: 4.5
  put32(dir, 0);       // this disk
  put32(dir, 0);       // the directory's disk
  put64(dir, count);
  put64(dir, count);
  put64(dir, dir_size);
  put64(dir, dir_offset);
  put32(dir, kZip64Locator);
  put32(dir, 0);
  put64(dir, zip64_end);
  put32(dir, 1);
  put32(dir, kEnd);
  put16(dir, 0);
  put16(dir, 0);
  put16(dir, static_cast<std::uint16_t>(std::min<std::uint64_t>(count, 0xFFFF)));
  put16(dir, static_cast<std::uint16_t>(std::min<std::uint64_t>(count, 0xFFFF)));
  put32(dir, static_cast<std::uint32_t>(std::min(dir_size, k32)));
  put32(dir, static_cast<std::uint32_t>(std::min(dir_offset, k32)));
  put16(dir, 0);
  z.writeSmall(dir);
  // Start writing it to the disk now (without waiting): the fsync that
  // commits the split's folder then finds it mostly written, and the disk
  // works while the next stage file is made.
  ::sync_file_range(z.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
  if (::close(z.fd) != 0) {
    z.fd = -1;
    z.fail("close", errno);
  }
  z.fd = -1;
  return z.hasher.hex();
}

}  // namespace pipeforge
