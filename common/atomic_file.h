// Atomic file writes: a reader sees the old file or the whole new one, never
// half of either, and a crash or a full disk leaves no stray temporary behind.
//
//   writeFileAtomically("out/pipe.svg", svg);          // bytes in hand
//
//   AtomicFile file("out/trained.pt");                   // a writer that wants a path
//   module.save(file.tempPath());
//   file.commit();                                       // or the destructor removes it
//
// Torch-free; every layer links it through pipeforge_common.
#pragma once

#include <string>
#include <string_view>

namespace pipeforge {

// Note [Atomic writes]: every file Pipeforge writes for a user (stage files,
// pipe.json, checkpoints, exports, schedules, SVG) goes through one recipe:
//   1. write a temporary sibling named by tempSiblingPath (same folder, so the
//      rename never crosses a file system; unique per process and call, so
//      several hosts sharing a folder never write the same temporary);
//   2. fsync it, so the rename below never publishes a name whose bytes are
//      still only in the page cache (ext4 and xfs may otherwise show an empty
//      file after a power loss);
//   3. rename(2) it over the target, which is atomic within a folder;
//   4. fsync the folder, so the new name itself is durable.
// Any failure removes the temporary and throws Error(kIo) naming the target.

// "<target>.tmp-<pid>-<random hex>": a fresh name beside `target`.
std::string tempSiblingPath(const std::string& target);

// Writes `bytes` to `path` by the recipe above. Throws Error(kIo) naming `path`
// and the system's reason.
void writeFileAtomically(const std::string& path, std::string_view bytes);

// For writers that need a file name of their own (torch's save, a zip writer):
// they write tempPath(), then commit() publishes it as the target. Destroyed
// uncommitted (an exception on the way), it removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(std::string target);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& target() const { return target_; }
  const std::string& tempPath() const { return temp_; }
  // fsync, rename over the target, fsync the folder. Throws Error(kIo); the
  // temporary is removed either way.
  void commit();

 private:
  std::string target_;
  std::string temp_;
  bool committed_ = false;
};

// A folder beside `target` that is removed with everything in it unless
// commit() renames it to `target`. A split writes all its stage files into
// one, so a failed split leaves nothing behind.
class AtomicDirectory {
 public:
  explicit AtomicDirectory(std::string target);
  ~AtomicDirectory();
  AtomicDirectory(const AtomicDirectory&) = delete;
  AtomicDirectory& operator=(const AtomicDirectory&) = delete;

  const std::string& tempPath() const { return temp_; }
  // fsyncs the folder's files and the folder, renames it to the target and
  // fsyncs the parent. An existing target is first moved aside under a
  // temporary name and removed once the new folder is in place, so the
  // target's name always holds a whole folder. Throws Error(kIo).
  void commit();

 private:
  std::string target_;
  std::string temp_;
};

// fsync(2) of one file or folder by name. Throws Error(kIo) naming `what`.
void syncPath(const std::string& path, const std::string& what);

}  // namespace pipeforge
