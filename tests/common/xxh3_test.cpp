// XXH3-128 digests: xxHash's reference values, in xxh128sum's canonical hex,
// streamed in pieces or read from a file.
#include "common/xxh3.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace pipeforge {
namespace {

TEST(Xxh3, MatchesXxh128sumOnKnownInputs) {
  Xxh3Digest empty;
  EXPECT_EQ(empty.hex(), "99aa06d3014798d86001c324468d497f");
  Xxh3Digest abc;
  abc.update("abc", 3);
  EXPECT_EQ(abc.hex(), "06b05ab6733a618578af5f94892f3950");
}

TEST(Xxh3, PiecesFilesAndRefusals) {
  std::string bytes(3 * (1 << 20) + 17, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 131 + (i >> 9));
  Xxh3Digest whole, pieces;
  whole.update(bytes.data(), bytes.size());
  for (std::size_t at = 0; at < bytes.size(); at += 65537) {
    pieces.update(bytes.data() + at, std::min<std::size_t>(65537, bytes.size() - at));
  }
  EXPECT_EQ(whole.hex(), pieces.hex());
  EXPECT_TRUE(isXxh3(whole.hex()));
  EXPECT_FALSE(isXxh3(whole.hex() + "0"));
  EXPECT_FALSE(isXxh3("99AA06D3014798D86001C324468D497F"));

  const auto path = std::filesystem::temp_directory_path() / ("pf-xxh3-" + std::to_string(::getpid()));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_EQ(xxh3OfFile(path.string()), whole.hex());
  std::filesystem::remove(path);
  try {
    xxh3OfFile(path.string());
    ADD_FAILURE() << "a missing file was hashed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read '" + path.string() + "'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge
