#include "common/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/error.h"

// Note [One run per folder]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Two runs writing one output or checkpoint folder corrupt each other without
// a word: the second resumes from the first's checkpoint in progress, both
// write the same step folders, metrics.jsonl gets two runs interleaved. So a
// run holds an exclusive flock(2) on `<folder>/.pipeforge.lock` for as long as
// it writes there, and a second run is refused before it splits or starts a
// rank, naming the first. The OS releases the lock when its holder exits,
// however it exits (SIGKILL, a crash, a lost host's NFS lease), so a dead
// run never blocks the folder; the file's text, "pid 1234 host h since ...
// command ...", only names the holder for the message. A holder that exits
// cleanly empties the file; one that died leaves its line, which is how the
// next run knows to warn that it takes over a lock left behind.
//
// Who holds it: `pipeforge train --nproc N`'s launcher, before it splits; its
// ranks inherit the descriptor, so the lock lasts while any of them runs. A
// job started by torchrun or srun has no launcher: its rank 0 takes it, first
// thing. The file is never deleted: unlinking a locked file would let a third
// run lock a new file of the same name while the second holds the old one.

namespace pipeforge {
namespace fs = std::filesystem;

namespace {

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

std::string commandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  for (char c : raw) out += c == '\0' ? ' ' : c;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (out.size() > 200) out = out.substr(0, 200) + "...";
  return out;
}

std::string utcNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32] = {};
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string readAll(int fd) {
  std::string text;
  char buffer[512];
  off_t at = 0;
  for (;;) {
    const ssize_t n = ::pread(fd, buffer, sizeof(buffer), at);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    at += n;
    if (text.size() > 4096) break;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// "pid 1234 host h since T command C" -> "PID 1234 on host h, since T: C".
std::string describeHolder(const std::string& line) {
  if (line.empty()) return "a process that has not written its name yet";
  std::istringstream in(line);
  std::string word, pid, host;
  in >> word >> pid >> word >> host;
  const auto since = line.find(" since ");
  const auto command = line.find(" command ");
  std::string out = "PID " + pid + " on host " + host;
  if (since != std::string::npos && command != std::string::npos && command > since) {
    out += ", since " + line.substr(since + 7, command - since - 7) + ": " + line.substr(command + 9);
  }
  return out;
}

}  // namespace

FolderLock::FolderLock(const std::string& dir, const std::string& key) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) made_ = dir;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::kIo, key + ": cannot create folder '" + dir + "': " + ec.message());
  path_ = (fs::path(dir) / kFolderLockFileName).string();
  // No O_CLOEXEC: the ranks a launcher starts keep the lock while they run.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd_ < 0) {
    throw Error(ErrorCode::kIo, key + ": cannot open the lock file '" + path_ + "': " + std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = readAll(fd_);
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) {
      throw Error(ErrorCode::kIo, key + ": cannot lock '" + path_ + "': " + std::strerror(err));
    }
    throw Error(ErrorCode::kUserInput,
                key + " '" + dir + "' is in use by another run (" + describeHolder(holder) +
                    "); two runs in one folder would overwrite each other's checkpoints and metrics: wait for that "
                    "run to end or stop it, or give this run another folder (--set " + key + "=OTHER_DIR)");
  }
  const std::string left = readAll(fd_);
  if (!left.empty()) {
    std::cerr << "warning: " << key << " '" << dir << "': taking over the lock left by " << describeHolder(left)
              << ", which ended without releasing it (killed or crashed)\n";
  }
  std::ostringstream line;
  line << "pid " << ::getpid() << " host " << hostName() << " since " << utcNow() << " command " << commandLine()
       << "\n";
  const std::string text = line.str();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw Error(ErrorCode::kIo, key + ": cannot write the lock file '" + path_ + "': " + std::strerror(err));
  }
}

FolderLock::FolderLock(FolderLock&& other) noexcept
    : path_(std::move(other.path_)), made_(std::move(other.made_)), fd_(other.fd_) {
  other.fd_ = -1;
}

FolderLock::~FolderLock() {
  if (fd_ < 0) return;
  // A folder this lock made and nothing else used goes again, while the lock
  // is still held.
  std::error_code ec;
  if (!made_.empty()) {
    bool only_lock = true;
    for (const auto& entry : fs::directory_iterator(made_, ec)) {
      if (entry.path().filename() != kFolderLockFileName) only_lock = false;
    }
    if (!ec && only_lock && fs::remove(path_, ec)) {
      fs::remove(made_, ec);
      ::close(fd_);
      return;
    }
  }
  // Released cleanly: an empty file tells the next run nobody died holding it.
  if (::ftruncate(fd_, 0) != 0) {
    // Nothing to do: the next run only warns about a lock left behind.
  }
  ::close(fd_);
}

}  // namespace pipeforge
