// One run per folder: an exclusive OS lock (flock) on a folder a run writes
// (Note [One run per folder]).
#pragma once

#include <string>

namespace pipeforge {

// The lock file inside a locked folder.
inline constexpr const char* kFolderLockFileName = ".pipeforge.lock";

class FolderLock {
 public:
  // Creates `dir` if missing and takes the lock of `dir` for this process
  // (and the processes it starts, which inherit the descriptor). `key` names
  // the folder in messages ("output.dir"). Throws Error{kUserInput} naming
  // the run that holds it (PID, host, command, since when) and the fix, or
  // Error{kIo} when the lock file cannot be made. A lock file left by a
  // process that died without releasing it is taken over, with a warning on
  // stderr naming that process. A folder the lock created is removed again
  // on release when nothing but the lock file is in it (a run refused before
  // it wrote anything leaves nothing behind).
  FolderLock(const std::string& dir, const std::string& key);
  ~FolderLock();
  FolderLock(FolderLock&& other) noexcept;
  FolderLock& operator=(FolderLock&&) = delete;
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string made_;  // the folder, when this lock created it
  int fd_ = -1;
};

}  // namespace pipeforge
