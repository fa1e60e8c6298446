// TorchZipWriter against LibTorch's PyTorchStreamWriter (byte for byte),
// LibTorch's reader and Python's zipfile; readZipDirectory on broken files.
#include "common/torch_zip.h"
#include "common/xxh3.h"

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "compat/torch_compat.h"
#include "tests/support/build_paths.h"
#include "tests/support/run_command.h"

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

std::string readAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string xxh3Hex(const std::string& bytes) {
  Xxh3Digest digest;
  digest.update(bytes.data(), bytes.size());
  return digest.hex();
}

std::uint32_t crcOf(const std::string& bytes) {
  return static_cast<std::uint32_t>(crc32_z(0, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()));
}

class TorchZipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pf-torch-zip-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 gen(7);
    // Sizes around the 64-byte alignment, empty, and one past the writer's
    // 8 MiB chunk (hashed in pieces).
    for (std::size_t size : {0ul, 1ul, 63ul, 64ul, 65ul, 4099ul, (8ul << 20) + 77}) {
      std::string bytes(size, '\0');
      for (auto& c : bytes) c = static_cast<char>(gen());
      records_.emplace_back("data/weights/weight_" + std::to_string(records_.size()), bytes);
    }
    records_.emplace_back("models/model.json", R"({"graph_module": {}})");
    records_.emplace_back("archive_format", "pt2");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string writeOurs(const fs::path& path, bool give_crcs) {
    TorchZipWriter writer(path.string(), path.stem().string());
    for (std::size_t i = 0; i < records_.size(); ++i) {
      const auto& [name, bytes] = records_[i];
      std::optional<std::uint32_t> crc;
      if (give_crcs && i % 2 == 0) crc = crcOf(bytes);  // as if copied from another archive
      writer.add(name, bytes.data(), bytes.size(), crc);
    }
    return writer.finish(6);
  }

  fs::path dir_;
  std::vector<std::pair<std::string, std::string>> records_;
};

// The same records through LibTorch's writer and ours give the same file,
// but for the serialization id (its bytes and CRC-32): alignment, headers,
// descriptors, directory and end records included.
TEST_F(TorchZipTest, WritesWhatPyTorchStreamWriterWrites) {
#if !PIPEFORGE_TORCH_AT_LEAST(2, 1)
  // 1.13's writer has neither the byteorder record nor the serialization id
  // that 2.x writes and Pipeforge writes on every build; 1.13 reads them
  // (LibTorchReadsItAndGivenCrcsAreKept), so there is no layout to match here.
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR << " writes the pre-2.1 layout";
#endif
  const fs::path theirs = dir_ / "stage_3.pt2";
  {
    caffe2::serialize::PyTorchStreamWriter writer(theirs.string());
    writer.setMinVersion(6);
    for (const auto& [name, bytes] : records_) writer.writeRecord(name, bytes.data(), bytes.size());
    writer.writeEndOfFile();
  }
  const fs::path ours_path = dir_ / "ours" / "stage_3.pt2";
  fs::create_directories(ours_path.parent_path());
  const std::string digest = writeOurs(ours_path, /*give_crcs=*/true);
  const std::string a = readAll(theirs), b = readAll(ours_path);
  if (a.size() != b.size()) {
    std::string both;
    for (const auto* f : {&a, &b}) {
      for (const ZipRecord& r : readZipDirectory(f->data(), f->size(), "either")) {
        both += r.name + " @" + std::to_string(r.data_offset) + " ";
      }
      both += "\n";
    }
    FAIL() << "PyTorchStreamWriter wrote " << a.size() << " bytes, we wrote " << b.size() << ":\n" << both;
  }
  EXPECT_EQ(digest, xxh3Hex(b));
  EXPECT_EQ(digest, xxh3OfFile(ours_path.string()));

  // Where the two may differ: the id's bytes, its CRC in its descriptor and
  // in its directory entry.
  const auto dir = readZipDirectory(b.data(), b.size(), "ours");
  ASSERT_EQ(dir.size(), records_.size() + 3);
  const ZipRecord& id = dir.back();
  ASSERT_EQ(id.name, "stage_3/.data/serialization_id");
  ASSERT_EQ(id.size, 40u);
  std::vector<std::pair<std::size_t, std::size_t>> allowed = {{id.data_offset, id.data_offset + 40},
                                                              {id.data_offset + 44, id.data_offset + 48}};
  const std::size_t entry = b.rfind("stage_3/.data/serialization_id") - 46;  // its directory entry
  allowed.push_back({entry + 16, entry + 20});
  std::size_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    const bool ok = std::any_of(allowed.begin(), allowed.end(), [&](auto r) { return i >= r.first && i < r.second; });
    EXPECT_TRUE(ok) << "byte " << i << " differs from PyTorchStreamWriter's";
    if (!ok && ++differing > 5) break;
  }
  const auto theirs_dir = readZipDirectory(a.data(), a.size(), "theirs");
  ASSERT_EQ(theirs_dir.size(), dir.size());
  for (std::size_t i = 0; i + 1 < dir.size(); ++i) {
    EXPECT_EQ(dir[i].name, theirs_dir[i].name);
    EXPECT_EQ(dir[i].data_offset, theirs_dir[i].data_offset);
    EXPECT_EQ(dir[i].data_offset % 64, 0u) << dir[i].name;
    EXPECT_EQ(dir[i].crc32, theirs_dir[i].crc32) << dir[i].name;
  }
  EXPECT_EQ(std::string(b.data() + id.data_offset, 40).find_first_not_of("0123456789"), std::string::npos);
}

// LibTorch reads every record back; a given CRC-32 is written as given.
TEST_F(TorchZipTest, LibTorchReadsItAndGivenCrcsAreKept) {
  const fs::path path = dir_ / "stage_0.pt2";
  writeOurs(path, /*give_crcs=*/false);
  caffe2::serialize::PyTorchStreamReader reader(path.string());
  for (const auto& [name, bytes] : records_) {
    ASSERT_TRUE(reader.hasRecord(name)) << name;
    auto [data, size] = reader.getRecord(name);
    ASSERT_EQ(size, bytes.size());
    EXPECT_EQ(std::string(static_cast<const char*>(data.get()), size), bytes) << name;
  }
  EXPECT_EQ(reader.version(), 6u);

  const std::string file = readAll(path);
  for (const ZipRecord& r : readZipDirectory(file.data(), file.size(), "stage_0.pt2")) {
    EXPECT_EQ(r.crc32, crcOf(file.substr(r.data_offset, r.size))) << r.name;
  }
  // A record copied with its source's CRC keeps it, even a wrong one: the
  // copy is as good as its source, and zip tools see the same fault.
  const fs::path copied = dir_ / "stage_1.pt2";
  {
    TorchZipWriter writer(copied.string(), "stage_1");
    writer.add("data/weights/weight_0", "abc", 3, 0xDEADBEEFu);
    writer.finish(6);
  }
  const std::string bytes = readAll(copied);
  EXPECT_EQ(readZipDirectory(bytes.data(), bytes.size(), "x").front().crc32, 0xDEADBEEFu);
}

// Python's zipfile checks every CRC-32 (testzip) and reads each record.
TEST_F(TorchZipTest, PythonZipfileChecksEveryCrc) {
  const std::string python = PIPEFORGE_PYTHON;
  if (python.empty()) GTEST_SKIP() << "no PIPEFORGE_PYTHON";
  const fs::path path = dir_ / "stage_2.pt2";
  writeOurs(path, /*give_crcs=*/true);
  const auto result = testing::runCommand(
      "'" + python + "' -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
      "assert z.testzip() is None; print(len(z.namelist()), len(z.read(\"stage_2/data/weights/weight_6\")))' '" +
      path.string() + "'");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(std::to_string(records_.size() + 3) + " " + std::to_string((8 << 20) + 77)),
            std::string::npos)
      << result.output;
}

// A truncated or scribbled-on archive is refused with a ZipError that says
// so, never read out of bounds.
TEST_F(TorchZipTest, BrokenDirectoriesAreRefused) {
  const fs::path path = dir_ / "stage_0.pt2";
  writeOurs(path, false);
  const std::string file = readAll(path);
  for (std::size_t cut : {std::size_t{0}, std::size_t{10}, file.size() / 2, file.size() - 23, file.size() - 1}) {
    const std::string part = file.substr(0, cut);
    try {
      readZipDirectory(part.data(), part.size(), "cut.pt2");
      ADD_FAILURE() << "a file cut at " << cut << " was read";
    } catch (const ZipError& e) {
      EXPECT_NE(std::string(e.what()).find("'cut.pt2' is not a readable zip archive"), std::string::npos) << e.what();
    }
  }
  // Every byte of the directory and end records flipped in turn: refused or
  // read, each record inside the file.
  const auto dir = readZipDirectory(file.data(), file.size(), "ok");
  const std::size_t start = file.rfind("PK\x01\x02", file.size()) - 200;
  for (std::size_t i = start; i < file.size(); ++i) {
    std::string bad = file;
    bad[i] = static_cast<char>(bad[i] ^ 0xFF);
    try {
      for (const ZipRecord& r : readZipDirectory(bad.data(), bad.size(), "bad")) {
        ASSERT_LE(r.data_offset + r.compressed_size, bad.size());
      }
    } catch (const ZipError&) {
    }
  }
  EXPECT_EQ(dir.size(), records_.size() + 3);
}

// Stages of big models pass 4 GiB: the zip64 fields (sizes and offsets in
// the directory's extra field, 64-bit descriptors), forced here from 100
// bytes on, read back by LibTorch, Python's zipfile and our reader.
TEST_F(TorchZipTest, Zip64FieldsAreReadBack) {
  const fs::path path = dir_ / "stage_4.pt2";
  {
    TorchZipWriter writer(path.string(), "stage_4", /*zip64_from=*/100);
    for (const auto& [name, bytes] : records_) writer.add(name, bytes.data(), bytes.size());
    writer.finish(6);
  }
  // 1.13's miniz (2.0.8) checks a directory entry's 32-bit offset field
  // plus its size against the archive's size even when that field says "in
  // the zip64 extra" (0xFFFFFFFF): true of every entry of a real archive
  // past 4 GiB, not of this small one with zip64 forced from 100 bytes.
  // Later miniz reads the extra field first.
#if PIPEFORGE_TORCH_AT_LEAST(2, 0)
  caffe2::serialize::PyTorchStreamReader reader(path.string());
  for (const auto& [name, bytes] : records_) {
    auto [data, size] = reader.getRecord(name);
    ASSERT_EQ(size, bytes.size()) << name;
    EXPECT_EQ(std::string(static_cast<const char*>(data.get()), size), bytes) << name;
  }
#endif
  const std::string file = readAll(path);
  const auto dir = readZipDirectory(file.data(), file.size(), "stage_4.pt2");
  ASSERT_EQ(dir.size(), records_.size() + 3);
  for (std::size_t i = 0; i < records_.size(); ++i) {
    EXPECT_EQ(dir[i].size, records_[i].second.size());
    EXPECT_EQ(file.substr(dir[i].data_offset, dir[i].size), records_[i].second);
  }
  const std::string python = PIPEFORGE_PYTHON;
  if (python.empty()) return;
  const auto result = testing::runCommand("'" + python +
                                          "' -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
                                          "assert z.testzip() is None; print(1)' '" + path.string() + "'");
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

}  // namespace
}  // namespace pipeforge
