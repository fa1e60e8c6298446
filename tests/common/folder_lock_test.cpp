// FolderLock (Note [One run per folder]): a second holder is refused naming
// the first; a lock left by a process that died is taken over with a warning;
// a clean release leaves nothing to warn about.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>

#include "common/error.h"
#include "common/folder_lock.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

class FolderLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("pipeforge_lock_test_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string lockText() const { return lockTextIn(dir_); }
  static std::string lockTextIn(const std::string& dir) {
    std::ifstream in(fs::path(dir) / kFolderLockFileName);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // What constructing a lock printed on stderr.
  static std::string stderrOf(const std::function<void()>& fn) {
    std::ostringstream captured;
    std::streambuf* old = std::cerr.rdbuf(captured.rdbuf());
    try {
      fn();
    } catch (...) {
      std::cerr.rdbuf(old);
      throw;
    }
    std::cerr.rdbuf(old);
    return captured.str();
  }

  std::string dir_;
};

TEST_F(FolderLockTest, ASecondHolderIsRefusedNamingTheFirst) {
  FolderLock first(dir_, "output.dir");
  EXPECT_NE(lockText().find("pid " + std::to_string(::getpid()) + " host "), std::string::npos) << lockText();
  // Another process: flock is per open file, so a child's attempt is a second run's.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string said = "<taken>";
    try {
      FolderLock second(dir_, "output.dir");
    } catch (const Error& e) {
      said = std::to_string(static_cast<int>(e.code())) + "|" + e.what();
    }
    (void)!::write(pipe_fds[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string said;
  char buffer[1024];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) said.append(buffer, n);
  ::close(pipe_fds[0]);
  ::waitpid(child, nullptr, 0);
  EXPECT_EQ(said.substr(0, 2), std::to_string(static_cast<int>(ErrorCode::kUserInput)) + "|") << said;
  EXPECT_NE(said.find("output.dir '" + dir_ + "' is in use by another run (PID " + std::to_string(::getpid()) +
                      " on host "),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("--set output.dir=OTHER_DIR"), std::string::npos) << said;
}

TEST_F(FolderLockTest, ACleanReleaseLeavesNoWarningAndTheLockIsFree) {
  { FolderLock first(dir_, "checkpoint.dir"); }
  EXPECT_EQ(lockText(), "");
  std::string warned = stderrOf([&] { FolderLock again(dir_, "checkpoint.dir"); });
  EXPECT_EQ(warned, "");
}

TEST_F(FolderLockTest, AFolderItMadeIsRemovedAgainUnlessSomethingWasWritten) {
  { FolderLock unused(dir_ + "/refused", "checkpoint.dir"); }
  EXPECT_FALSE(fs::exists(dir_ + "/refused")) << "a refused run leaves nothing behind";
  {
    FolderLock used(dir_ + "/used", "output.dir");
    std::ofstream(dir_ + "/used/metrics.jsonl") << "{}\n";
  }
  EXPECT_TRUE(fs::exists(dir_ + "/used/metrics.jsonl"));
  EXPECT_EQ(lockTextIn(dir_ + "/used"), "");
  fs::create_directories(dir_ + "/existing");
  { FolderLock given(dir_ + "/existing", "output.dir"); }
  EXPECT_TRUE(fs::exists(dir_ + "/existing")) << "a folder the user made stays";
}

TEST_F(FolderLockTest, ALockLeftByADeadProcessIsTakenOverWithAWarning) {
  // A holder SIGKILLed while holding it: the OS dropped its lock, its line stays.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FolderLock held(dir_, "output.dir");
    ::raise(SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  ASSERT_NE(lockText().find("pid " + std::to_string(child)), std::string::npos) << lockText();
  std::string warned = stderrOf([&] { FolderLock taken(dir_, "output.dir"); });
  EXPECT_NE(warned.find("warning: output.dir '" + dir_ + "': taking over the lock left by PID " +
                        std::to_string(child) + " on host "),
            std::string::npos)
      << warned;
  EXPECT_NE(warned.find("ended without releasing it"), std::string::npos) << warned;
}

TEST_F(FolderLockTest, AFolderThatCannotBeMadeIsAnIoError) {
  std::ofstream(dir_ + "-file") << "x";
  try {
    FolderLock lock(dir_ + "-file/sub", "output.dir");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("output.dir: cannot create folder"), std::string::npos) << e.what();
  }
  fs::remove(dir_ + "-file");
}

}  // namespace
}  // namespace pipeforge
