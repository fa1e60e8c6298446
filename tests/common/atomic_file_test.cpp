// Atomic writes (Note [Atomic writes]): the target holds the old bytes or the
// new ones, a failure leaves no temporary, and folders swap in whole.
#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/error.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The names in `dir`, sorted: a test sees every leftover temporary.
std::set<std::string> namesIn(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pf_atomic_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                        "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(AtomicFileTest, WritesAndReplacesWithoutLeavingTemporaries) {
  const std::string target = (dir_ / "a.txt").string();
  writeFileAtomically(target, "first");
  EXPECT_EQ(readAll(target), "first");
  writeFileAtomically(target, std::string("second\0bytes", 12));
  EXPECT_EQ(readAll(target), std::string("second\0bytes", 12));
  EXPECT_EQ(namesIn(dir_), std::set<std::string>{"a.txt"});
}

TEST_F(AtomicFileTest, AMissingFolderIsAnIoErrorNamingTheTarget) {
  const std::string target = (dir_ / "no_such_folder" / "a.txt").string();
  try {
    writeFileAtomically(target, "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(e.what()).find("cannot write '" + target + "'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

TEST_F(AtomicFileTest, TempNamesAreSiblingsAndUnique) {
  const std::string target = (dir_ / "x.pt").string();
  const std::string a = tempSiblingPath(target), b = tempSiblingPath(target);
  EXPECT_NE(a, b);
  EXPECT_EQ(fs::path(a).parent_path(), dir_);
  EXPECT_EQ(a.rfind(target + ".tmp-", 0), 0u) << a;
}

TEST_F(AtomicFileTest, AnUncommittedFileIsRemovedAndTheOldTargetKept) {
  const std::string target = (dir_ / "model.pt").string();
  writeFileAtomically(target, "old");
  {
    AtomicFile file(target);
    std::ofstream(file.tempPath()) << "half written";
    EXPECT_TRUE(fs::exists(file.tempPath()));
    // An exception here (torch's save failing) destroys `file` uncommitted.
  }
  EXPECT_EQ(readAll(target), "old");
  EXPECT_EQ(namesIn(dir_), std::set<std::string>{"model.pt"});

  AtomicFile file(target);
  std::ofstream(file.tempPath()) << "new";
  file.commit();
  EXPECT_EQ(readAll(target), "new");
  EXPECT_EQ(namesIn(dir_), std::set<std::string>{"model.pt"});
}

TEST_F(AtomicFileTest, CommittingAFileNobodyWroteIsAnIoError) {
  AtomicFile file((dir_ / "never.pt").string());
  EXPECT_THROW(file.commit(), Error);
  EXPECT_TRUE(namesIn(dir_).empty());
}

TEST_F(AtomicFileTest, AFolderAppearsWholeOrNotAtAll) {
  const fs::path target = dir_ / "stages";
  {
    AtomicDirectory folder(target.string());
    std::ofstream(fs::path(folder.tempPath()) / "stage_0.pt") << "s0";
    EXPECT_FALSE(fs::exists(target));
    // A failed split: destroyed uncommitted.
  }
  EXPECT_TRUE(namesIn(dir_).empty());

  AtomicDirectory folder(target.string());
  std::ofstream(fs::path(folder.tempPath()) / "stage_0.pt") << "s0";
  folder.commit();
  EXPECT_EQ(readAll(target / "stage_0.pt"), "s0");
  EXPECT_EQ(namesIn(dir_), std::set<std::string>{"stages"});
}

TEST_F(AtomicFileTest, ReplacingAFolderDropsTheOldOne) {
  const fs::path target = dir_ / "stages";
  fs::create_directories(target);
  std::ofstream(target / "stage_0.pt") << "old";
  std::ofstream(target / "stage_9.pt") << "only in the old split";

  AtomicDirectory folder(target.string());
  std::ofstream(fs::path(folder.tempPath()) / "stage_0.pt") << "new";
  folder.commit();
  EXPECT_EQ(readAll(target / "stage_0.pt"), "new");
  EXPECT_FALSE(fs::exists(target / "stage_9.pt"));
  EXPECT_EQ(namesIn(dir_), std::set<std::string>{"stages"});
}

}  // namespace
}  // namespace pipeforge
