#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "common/error.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

std::string systemReason(int err) { return std::strerror(err); }

// The folder holding `path` ("." for a bare name).
std::string parentOf(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Folders cannot always be fsynced (some file systems answer EINVAL); the
// file's own fsync already happened, so only real I/O errors count.
void syncFolder(const std::string& folder) {
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0 && err == EIO) {
    throw Error(ErrorCode::kIo, "cannot sync folder '" + folder + "': " + systemReason(err));
  }
}

void removeQuietly(const std::string& path) {
  if (!path.empty()) std::remove(path.c_str());
}

}  // namespace

std::string tempSiblingPath(const std::string& target) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, ".tmp-%ld-%012llx", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return target + suffix;
}

void syncPath(const std::string& path, const std::string& what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open '" + what + "' to sync it: " + systemReason(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(ErrorCode::kIo, "cannot write '" + what + "': " + systemReason(err));
}

void writeFileAtomically(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  int fd = ::open(file.tempPath().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw Error(ErrorCode::kIo, "cannot write '" + path + "': " + systemReason(errno) +
                                    " (does the folder exist and is it writable?)");
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      throw Error(ErrorCode::kIo, "cannot write '" + path + "': " + systemReason(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) throw Error(ErrorCode::kIo, "cannot write '" + path + "': " + systemReason(errno));
  file.commit();
}

AtomicFile::AtomicFile(std::string target) : target_(std::move(target)), temp_(tempSiblingPath(target_)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) removeQuietly(temp_);
}

void AtomicFile::commit() {
  try {
    syncPath(temp_, target_);
  } catch (...) {
    removeQuietly(temp_);
    committed_ = true;
    throw;
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    int err = errno;
    removeQuietly(temp_);
    committed_ = true;
    throw Error(ErrorCode::kIo, "cannot write '" + target_ + "' (renaming its temporary failed: " +
                                    systemReason(err) + ")");
  }
  committed_ = true;
  syncFolder(parentOf(target_));
}

AtomicDirectory::AtomicDirectory(std::string target) : target_(std::move(target)) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = tempSiblingPath(target_);
    std::error_code ec;
    if (fs::create_directory(candidate, ec)) {
      temp_ = candidate;
      return;
    }
    if (ec && ec != std::errc::file_exists) {
      throw Error(ErrorCode::kIo, "cannot create a folder beside '" + target_ + "': " + ec.message());
    }
  }
  throw Error(ErrorCode::kIo, "cannot create a temporary folder beside '" + target_ + "'");
}

AtomicDirectory::~AtomicDirectory() {
  if (temp_.empty()) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);
}

void AtomicDirectory::commit() {
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(temp_, ec)) {
    if (entry.is_regular_file(ec)) syncPath(entry.path().string(), target_ + "/" + entry.path().filename().string());
  }
  syncFolder(temp_);
  std::string old;
  if (fs::exists(target_, ec)) {
    old = tempSiblingPath(target_);
    if (::rename(target_.c_str(), old.c_str()) != 0) {
      throw Error(ErrorCode::kIo, "cannot replace folder '" + target_ + "' (moving it aside failed: " +
                                      systemReason(errno) + ")");
    }
  }
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    int err = errno;
    if (!old.empty()) ::rename(old.c_str(), target_.c_str());  // put the old folder back
    throw Error(ErrorCode::kIo, "cannot write folder '" + target_ + "' (renaming its temporary failed: " +
                                    systemReason(err) + ")");
  }
  temp_.clear();
  syncFolder(parentOf(target_));
  if (!old.empty()) fs::remove_all(old, ec);
}

}  // namespace pipeforge
