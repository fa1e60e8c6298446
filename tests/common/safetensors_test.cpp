// The safetensors reader and writer (common/safetensors.h): round trips of
// every dtype, each malformed header refused with its own message (Note
// [Untrusted headers]), folders with an index, save_pretrained's sharding, and
// files exchanged with Python's safetensors and huggingface_hub.
#include "common/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/support/run_command.h"
#ifdef PIPEFORGE_TEST_HAS_BUILD_PATHS
#include "tests/support/build_paths.h"
#endif

namespace pipeforge {
namespace {

namespace fs = std::filesystem;

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeBytes(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

std::string le64(std::uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file by hand: the length, `header` as given, then `data`.
std::string fileBytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

std::string bytesOf(const SafetensorsTensor& t) { return std::string(reinterpret_cast<const char*>(t.data), t.nbytes); }

// What parsing `bytes` throws ("" when it parses).
std::string parseError(const std::string& bytes) {
  try {
    SafetensorsFile::parse(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), "bad.safetensors");
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput) << e.what();
    return e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "'" << (text) << "' lacks '" << (part) << "'"

// One tensor to write; `calls` counts its fill calls.
SafetensorsEntry entry(const std::string& name, const std::string& dtype, std::vector<std::int64_t> shape,
                       const std::string& bytes, std::shared_ptr<int> calls = nullptr) {
  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.nbytes = bytes.size();
  e.fill = [bytes, calls](std::uint8_t* out) {
    std::memcpy(out, bytes.data(), bytes.size());
    if (calls) ++*calls;
  };
  return e;
}

std::string pattern(std::size_t n, int seed) {
  std::string out(n, '\0');
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<char>((seed * 31 + i * 7 + 1) & 0xff);
  return out;
}

std::string floats(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), sizeof v);
  return out;
}

std::set<std::string> namesIn(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pf_safetensors_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// The 22 dtypes in the order safetensors 0.8.0's writer puts them (Note
// [Safetensors]): its Dtype enum, reversed.
const std::vector<std::pair<std::string, int>> kWriteOrder = {
    {"U64", 64},         {"I64", 64},         {"F64", 64},     {"C64", 64},     {"F32", 32},     {"U32", 32},
    {"I32", 32},         {"BF16", 16},        {"F16", 16},     {"U16", 16},     {"I16", 16},     {"F8_E5M2FNUZ", 8},
    {"F8_E4M3FNUZ", 8},  {"F8_E8M0", 8},      {"F8_E4M3", 8},  {"F8_E5M2", 8},  {"I8", 8},       {"U8", 8},
    {"F6_E3M2", 6},      {"F6_E2M3", 6},      {"F4", 4},       {"BOOL", 8},
};

TEST(SafetensorsDtypes, BitsOfEveryNameAndNothingElse) {
  for (const auto& [name, bits] : kWriteOrder) EXPECT_EQ(safetensorsDtypeBits(name), bits) << name;
  EXPECT_EQ(kWriteOrder.size(), 22u);
  EXPECT_EQ(safetensorsDtypeBits("bf16"), std::nullopt);
  EXPECT_EQ(safetensorsDtypeBits("C128"), std::nullopt);
  EXPECT_EQ(safetensorsDtypeBits("float32"), std::nullopt);
}

TEST_F(SafetensorsTest, EveryDtypeRoundTripsInTheWritersOrder) {
  std::vector<SafetensorsEntry> entries;
  auto calls = std::make_shared<int>(0);
  // Given in reverse, so the writer's order is its own doing.
  for (auto it = kWriteOrder.rbegin(); it != kWriteOrder.rend(); ++it) {
    const std::size_t nbytes = 8 * static_cast<std::size_t>(it->second) / 8;  // shape [2, 4]: 8 elements
    entries.push_back(entry("t_" + it->first, it->first, {2, 4}, pattern(nbytes, it->second), calls));
  }
  // BF16 1.0, -2.5, 3.140625: 0x3F80, 0xC020, 0x4049, little-endian.
  const std::string bf16("\x80\x3f\x20\xc0\x49\x40", 6);
  entries.push_back(entry("bf", "BF16", {3}, bf16, calls));
  entries.push_back(entry("scalar", "F32", {}, floats({3.5f}), calls));
  entries.push_back(entry("empty", "I64", {0}, "", calls));
  entries.push_back(entry("empty2d", "F32", {3, 0}, "", calls));
  const std::string file = path("all.safetensors");
  writeSafetensors(file, entries);
  EXPECT_EQ(*calls, static_cast<int>(entries.size()) - 2);  // once each; the empty ones have no bytes
  EXPECT_EQ(namesIn(dir_), std::set<std::string>{"all.safetensors"});

  const auto st = SafetensorsFile::open(file);
  EXPECT_EQ(st->path(), file);
  EXPECT_EQ(st->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  std::vector<std::string> order;
  for (const auto& t : st->tensors()) order.push_back(t.name);
  std::vector<std::string> expected;
  for (const auto& [dtype, bits] : kWriteOrder) {
    if (dtype == "I64") expected.push_back("empty");
    if (dtype == "F32") {
      expected.push_back("empty2d");
      expected.push_back("scalar");
    }
    if (dtype == "BF16") expected.push_back("bf");
    expected.push_back("t_" + dtype);
  }
  EXPECT_EQ(order, expected);

  const std::string raw = readAll(file);
  std::uint64_t header = 0;
  std::memcpy(&header, raw.data(), 8);
  EXPECT_EQ(header % 8, 0u);
  const std::string start = "{\"__metadata__\":{\"format\":\"pt\"},\"t_U64\":";
  EXPECT_EQ(raw.substr(8, start.size()), start);
  const auto* data0 = reinterpret_cast<const std::uint8_t*>(st->tensors().front().data);
  for (const auto& [dtype, bits] : kWriteOrder) {
    const SafetensorsTensor* t = st->find("t_" + dtype);
    ASSERT_NE(t, nullptr) << dtype;
    EXPECT_EQ(t->dtype, dtype);
    EXPECT_EQ(t->shape, (std::vector<std::int64_t>{2, 4}));
    EXPECT_EQ(t->numel(), 8);
    EXPECT_EQ(bytesOf(*t), pattern(static_cast<std::size_t>(bits), bits)) << dtype;
    // Each tensor starts at a multiple of its element size.
    if (bits >= 8) {
      EXPECT_EQ((t->data - data0) % (bits / 8), 0) << dtype;
    }
  }
  EXPECT_EQ(bytesOf(*st->find("bf")), bf16);
  const SafetensorsTensor* scalar = st->find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  float value = 0;
  ASSERT_EQ(scalar->nbytes, 4u);
  std::memcpy(&value, scalar->data, 4);
  EXPECT_EQ(value, 3.5f);
  const SafetensorsTensor* empty = st->find("empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->shape, std::vector<std::int64_t>{0});
  EXPECT_EQ(empty->nbytes, 0u);
  EXPECT_EQ(empty->numel(), 0);
  EXPECT_EQ(st->find("missing"), nullptr);
}

// The exact bytes safetensors 0.8.0 writes for F64 "ab" and "d" and U8 "c"
// (captured from safetensors.torch.save), padded with spaces.
TEST_F(SafetensorsTest, WritesTheHeaderSafetensorsWrites) {
  const std::string file = path("three.safetensors");
  writeSafetensors(file,
                   {entry("c", "U8", {1}, "\x07"), entry("d", "F64", {1}, std::string(8, '\x02')),
                    entry("ab", "F64", {1}, std::string(8, '\x01'))},
                   {});
  const std::string expected_header =
      "{\"ab\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
      "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[16,17]}}";
  const std::string padded = expected_header + std::string((8 - expected_header.size() % 8) % 8, ' ');
  EXPECT_EQ(readAll(file), le64(padded.size()) + padded + std::string(8, '\x01') + std::string(8, '\x02') + "\x07");
  EXPECT_TRUE(SafetensorsFile::open(file)->metadata().empty());
}

TEST_F(SafetensorsTest, WriterRefusesBadEntriesBeforeWritingAnything) {
  const std::string file = path("bad.safetensors");
  const auto refusal = [&](std::vector<SafetensorsEntry> entries) {
    try {
      writeSafetensors(file, entries);
    } catch (const SafetensorsError& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUserInput);
      return std::string(e.what());
    }
    return std::string("(written)");
  };
  std::string why = refusal({entry("a", "float32", {1}, "abcd")});
  EXPECT_CONTAINS(why, "writing '" + file + "': tensor \"a\": dtype \"float32\" is not a safetensors dtype");
  why = refusal({entry("a", "f32", {1}, "abcd")});
  EXPECT_CONTAINS(why, "the names are upper case (\"F32\")");
  why = refusal({entry("a", "F32", {2}, "abcd")});
  EXPECT_CONTAINS(why, "tensor \"a\": shape [2] of F32 takes 8 bytes, but the entry gives 4");
  why = refusal({entry("a", "F32", {1}, "abcd"), entry("a", "F32", {1}, "abcd")});
  EXPECT_CONTAINS(why, "tensor \"a\": the name is given twice");
  why = refusal({entry("a", "F32", {-1}, "")});
  EXPECT_CONTAINS(why, "negative dimension");
  why = refusal({entry("a", "F4", {3}, "ab")});
  EXPECT_CONTAINS(why, "shape [3] of 4-bit F4 does not end on a byte boundary");
  why = refusal({entry("__metadata__", "U8", {1}, "a")});
  EXPECT_CONTAINS(why, "metadata key");
  EXPECT_TRUE(namesIn(dir_).empty());

  // A fill that throws leaves no file and no temporary behind.
  SafetensorsEntry throwing = entry("x", "U8", {1}, "a");
  throwing.fill = [](std::uint8_t*) { throw std::runtime_error("no bytes today"); };
  EXPECT_THROW(writeSafetensors(file, {entry("a", "U8", {1}, "a"), throwing}), std::runtime_error);
  EXPECT_TRUE(namesIn(dir_).empty());
}

TEST_F(SafetensorsTest, AMissingFolderIsAnIoError) {
  try {
    writeSafetensors(path("no/such/dir/x.safetensors"), {entry("a", "U8", {1}, "a")});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
    EXPECT_CONTAINS(std::string(e.what()), "no/such/dir/x.safetensors");
  }
}

// --- malformed files, each with its own message --------------------------------------

const std::string kA4 = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";

TEST(SafetensorsParse, AValidHandWrittenFileParses) {
  const std::string bytes = fileBytes("{" + kA4 + R"(,"__metadata__":{"k":"v"}}   )", "abcd");
  const auto st = SafetensorsFile::parse(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), "x");
  ASSERT_EQ(st->tensors().size(), 1u);
  EXPECT_EQ(bytesOf(st->tensors()[0]), "abcd");
  EXPECT_EQ(st->metadata().at("k"), "v");
  EXPECT_EQ(parseError(fileBytes(R"( {"__metadata__":null})")), "");  // leading space, null metadata: as safetensors
  EXPECT_EQ(parseError(fileBytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":[1]}})", "z")), "");
}

TEST(SafetensorsParse, TheLengthField) {
  std::string why = parseError("abc");
  EXPECT_CONTAINS(why, "safetensors file 'bad.safetensors': it holds 3 bytes, fewer than the 8");
  why = parseError(le64(100'000'001) + "{}");
  EXPECT_CONTAINS(why, "a header of 100000001 bytes, more than the format's limit of 100000000");
  why = parseError(le64(100) + "{\"a\":1}");
  EXPECT_CONTAINS(why, "its header is 100 bytes long but the file holds only 7 bytes after the length field: it is cut short");
}

TEST(SafetensorsParse, TheHeaderIsOneJsonObject) {
  EXPECT_CONTAINS(parseError(fileBytes("[]")), "the header: it is an array, not a JSON object");
  EXPECT_CONTAINS(parseError(fileBytes("{\"a\":")), "the header: it is not valid JSON: ");
  EXPECT_CONTAINS(parseError(fileBytes("")), "the header: it is not valid JSON");
  EXPECT_CONTAINS(parseError(fileBytes("{} x")), "the header: it is not valid JSON");
  const std::string nul = parseError(fileBytes(std::string("{}\0\0\0\0\0\0", 8)));
  EXPECT_CONTAINS(nul, "its header holds a NUL byte at header byte 2 of 8: a header is padded with spaces");
  EXPECT_CONTAINS(nul, "re-save it with safetensors.torch.save_file or save_pretrained");
  EXPECT_CONTAINS(parseError(fileBytes(std::string(200, '[') + std::string(200, ']'))), "nested deeper than 128");
}

TEST(SafetensorsParse, RepeatedKeysAnywhere) {
  EXPECT_CONTAINS(parseError(fileBytes("{" + kA4 + "," + kA4 + "}", "abcd")), "the header: tensor \"a\" appears twice");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "z")),
                  "tensor \"a\" has field \"dtype\" twice");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"__metadata__":{"k":"1","k":"2"}})")), "__metadata__ has key \"k\" twice");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"__metadata__":{},"__metadata__":{}})")), "\"__metadata__\" appears twice");
}

TEST(SafetensorsParse, Metadata) {
  EXPECT_CONTAINS(parseError(fileBytes(R"({"__metadata__":{"format":1}})")),
                  "__metadata__ key \"format\" holds the integer 1; metadata values are strings");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"__metadata__":["pt"]})")), "__metadata__ is an array, not an object");
}

std::string oneTensor(const std::string& dtype, const std::string& shape, const std::string& offsets,
                      const std::string& data) {
  return parseError(fileBytes(R"({"t":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offsets +
                                  "}}",
                              data));
}

TEST(SafetensorsParse, Dtypes) {
  std::string why = oneTensor("\"C128\"", "[1]", "[0,16]", std::string(16, 'x'));
  EXPECT_CONTAINS(why, "tensor \"t\": dtype \"C128\" is not a safetensors dtype (the format has BOOL, F4, F6_E2M3");
  EXPECT_CONTAINS(why, "; re-save it with safetensors.torch.save_file or save_pretrained");
  EXPECT_CONTAINS(oneTensor("\"bf16\"", "[1]", "[0,2]", "xx"),
                  "dtype \"bf16\" is not a safetensors dtype: the names are upper case (\"BF16\")");
  EXPECT_CONTAINS(oneTensor("32", "[1]", "[0,4]", "xxxx"), "its dtype is the integer 32, not a string");
  // Sub-byte dtypes: whole bytes only.
  EXPECT_CONTAINS(oneTensor("\"F4\"", "[1]", "[0,1]", "x"), "shape [1] of 4-bit F4 does not end on a byte boundary");
  EXPECT_CONTAINS(oneTensor("\"F6_E2M3\"", "[2]", "[0,2]", "xx"),
                  "shape [2] of 6-bit F6_E2M3 does not end on a byte boundary");
  EXPECT_EQ(oneTensor("\"F4\"", "[2]", "[0,1]", "x"), "");
  EXPECT_EQ(oneTensor("\"F6_E3M2\"", "[4]", "[0,3]", "xyz"), "");
}

TEST(SafetensorsParse, Shapes) {
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[-1]", "[0,0]", ""), "dimension 0 of its shape: -1 is negative");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[2, 1.5]", "[0,3]", "xxx"), "dimension 1 of its shape: 1.5 is not a whole number");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[\"2\"]", "[0,2]", "xx"), "a string is not a whole number");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "2", "[0,2]", "xx"), "its shape is the integer 2, not a list of dimensions");
  std::string many = "[";
  for (int i = 0; i < 65; ++i) many += (i ? ",1" : "1");
  EXPECT_CONTAINS(oneTensor("\"U8\"", many + "]", "[0,1]", "x"), "its shape has 65 dimensions, more than the 64");
  EXPECT_CONTAINS(oneTensor("\"F32\"", "[2]", "[0,4]", "xxxx"),
                  "tensor \"t\": shape [2] of F32 takes 8 bytes but its data_offsets [0, 4] hold 4");
  // numel x size overflows 64 bits.
  EXPECT_CONTAINS(oneTensor("\"F64\"", "[4294967296, 4294967296]", "[0,8]", std::string(8, 'x')),
                  "holds too many elements to count");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[18446744073709551615]", "[0,1]", "x"), "18446744073709551615 is too large");
}

TEST(SafetensorsParse, Offsets) {
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[0]", "[4,0]", "xxxx"), "its data_offsets [4, 0] begin after they end");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[1]", "[0,1,2]", "x"), "its data_offsets is a list of 3, not a pair [begin, end]");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[1]", "{}", "x"), "its data_offsets is an object, not a pair");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[1]", "[-1,0]", "x"), "data_offsets begin: -1 is negative");
  EXPECT_CONTAINS(oneTensor("\"U8\"", "[1]", "[0,1.0]", "x"), "data_offsets end: 1.0 is not a whole number");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"t":{"shape":[1],"data_offsets":[0,1]}})", "x")),
                  "tensor \"t\": its entry has no \"dtype\"");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"t":[1]})", "x")), "tensor \"t\": its entry is an array, not an object");
}

TEST(SafetensorsParse, TensorsTileTheDataExactly) {
  const std::string a = R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string b8 = R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]})";
  const std::string b4 = R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})";
  // Gap between two tensors, and before the first.
  EXPECT_CONTAINS(parseError(fileBytes("{" + a + "," + b8 + "}", std::string(12, 'x'))),
                  "tensor \"b\" begins at data byte 8 but \"a\" before it ends at byte 4: bytes 4..8 belong to no tensor");
  EXPECT_CONTAINS(parseError(fileBytes("{" + b8 + "}", std::string(12, 'x'))),
                  "its first tensor \"b\" begins at data byte 8, not 0: bytes 0..8 belong to no tensor");
  // Overlap, and two names on one range.
  const std::string wide = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  EXPECT_CONTAINS(parseError(fileBytes("{" + wide + "," + b4 + "}", std::string(8, 'x'))),
                  "tensor \"b\" (data bytes 4..8) overlaps \"w\", which ends at byte 8");
  EXPECT_CONTAINS(parseError(fileBytes("{" + a + R"(,"c":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                                       std::string(4, 'x'))),
                  "tensor \"c\" (data bytes 0..4) overlaps \"a\"");
  // Trailing bytes, and a file cut short.
  EXPECT_CONTAINS(parseError(fileBytes("{" + a + "}", std::string(8, 'x'))),
                  "its tensors end at data byte 4 but the file holds 8 data bytes: 4 trailing bytes belong to no tensor");
  EXPECT_CONTAINS(parseError(fileBytes("{" + a + "," + b4 + "}", std::string(6, 'x'))),
                  "tensor \"b\" ends at data byte 8 but the file holds only 6 data bytes after its header: it is cut short");
  EXPECT_CONTAINS(parseError(fileBytes(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1000000,1000001]}})")),
                  "its first tensor \"a\" begins at data byte 1000000");
  // In any JSON order, empty tensors anywhere: fine, and handed out in data order.
  const std::string ok = fileBytes("{" + b4 + R"(,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)" + a + "}",
                                   "aaaabbbb");
  const auto st = SafetensorsFile::parse(reinterpret_cast<const std::uint8_t*>(ok.data()), ok.size(), "ok");
  ASSERT_EQ(st->tensors().size(), 3u);
  EXPECT_EQ(st->tensors()[0].name, "a");
  EXPECT_EQ(st->tensors()[1].name, "e");
  EXPECT_EQ(st->tensors()[2].name, "b");
  EXPECT_EQ(bytesOf(*st->find("b")), "bbbb");
}

TEST_F(SafetensorsTest, OpenNamesTheFile) {
  try {
    SafetensorsFile::open(path("nothing.safetensors"));
    FAIL() << "expected an error";
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput);
    EXPECT_CONTAINS(std::string(e.what()), "no such safetensors file '" + path("nothing.safetensors") + "'");
  }
  writeBytes(path("short.safetensors"), "");
  try {
    SafetensorsFile::open(path("short.safetensors"));
    FAIL() << "expected an error";
  } catch (const SafetensorsError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "safetensors file '" + path("short.safetensors") + "': it holds 0 bytes");
  }
  writeBytes(path("trail.safetensors"), fileBytes("{" + kA4 + "}", "abcdef"));
  try {
    SafetensorsFile::open(path("trail.safetensors"));
    FAIL() << "expected an error";
  } catch (const SafetensorsError& e) {
    EXPECT_CONTAINS(std::string(e.what()), "safetensors file '" + path("trail.safetensors") + "': its tensors end");
  }
}

// --- folders ------------------------------------------------------------------------

void writeIndex(const fs::path& dir, const std::string& weight_map) {
  writeBytes(dir / "model.safetensors.index.json",
             "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" + weight_map + "}}");
}

TEST_F(SafetensorsTest, SourceReadsAFileAFolderAndAnIndexWithShards) {
  writeSafetensors(path("one.safetensors"), {entry("w", "F32", {1}, floats({2.0f}))});
  SafetensorsSource file = SafetensorsSource::open(path("one.safetensors"));
  EXPECT_EQ(file.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(file.fileOf("w"), path("one.safetensors"));
  EXPECT_EQ(file.totalBytes(), 4u);

  fs::create_directories(dir_ / "sharded");
  writeSafetensors(path("sharded/s1.safetensors"), {entry("a", "F32", {2}, floats({1, 2})), entry("b", "U8", {3}, "xyz")});
  writeSafetensors(path("sharded/s2.safetensors"),
                   {entry("c", "I64", {1}, std::string(8, '\x05')), entry("unlisted", "U8", {1}, "u")});
  writeIndex(dir_ / "sharded", R"("a": "s1.safetensors", "b": "s1.safetensors", "c": "s2.safetensors")");
  SafetensorsSource source = SafetensorsSource::open(path("sharded"));
  EXPECT_EQ(source.path(), path("sharded"));
  // Every tensor of every listed shard, as transformers reads them.
  EXPECT_EQ(source.names(), (std::vector<std::string>{"a", "b", "c", "unlisted"}));
  EXPECT_EQ(source.fileOf("b"), path("sharded/s1.safetensors"));
  EXPECT_EQ(source.fileOf("c"), path("sharded/s2.safetensors"));
  EXPECT_EQ(source.fileOf("zzz"), "");
  EXPECT_EQ(source.find("zzz"), nullptr);
  ASSERT_NE(source.find("c"), nullptr);
  EXPECT_EQ(bytesOf(*source.find("c")), std::string(8, '\x05'));
  EXPECT_EQ(bytesOf(*source.find("b")), "xyz");
  EXPECT_EQ(source.totalBytes(), 8u + 3u + 8u + 1u);
  // The index file itself names the same checkpoint.
  const SafetensorsSource by_index = SafetensorsSource::open(path("sharded/model.safetensors.index.json"));
  EXPECT_EQ(by_index.names(), source.names());
  EXPECT_EQ(by_index.fileOf("c"), path("sharded/s2.safetensors"));

  // model.safetensors, when present, is the checkpoint (as transformers reads it).
  writeSafetensors(path("sharded/model.safetensors"), {entry("only", "U8", {1}, "o")});
  EXPECT_EQ(SafetensorsSource::open(path("sharded")).names(), std::vector<std::string>{"only"});
}

std::string sourceError(const std::string& path) {
  try {
    SafetensorsSource::open(path);
  } catch (const SafetensorsError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUserInput) << e.what();
    return e.what();
  }
  return "";
}

TEST_F(SafetensorsTest, SourceRefusesBrokenFolders) {
  EXPECT_CONTAINS(sourceError(path("nope")), "no such file or folder '" + path("nope") + "'");
  fs::create_directories(dir_ / "empty");
  const std::string empty = sourceError(path("empty"));
  EXPECT_CONTAINS(empty, "folder '" + path("empty") + "' holds neither model.safetensors nor model.safetensors.index.json");
  EXPECT_CONTAINS(empty, "a folder written by save_pretrained holds one of them");

  const fs::path d = dir_ / "d";
  fs::create_directories(d);
  writeSafetensors((d / "s1.safetensors").string(), {entry("a", "U8", {1}, "a"), entry("b", "U8", {1}, "b")});
  writeSafetensors((d / "s2.safetensors").string(), {entry("b", "U8", {1}, "B")});
  const std::string index = (d / "model.safetensors.index.json").string();

  writeIndex(d, R"("a": "s1.safetensors", "x": "missing.safetensors")");
  EXPECT_CONTAINS(sourceError(d.string()), "index '" + index + "': shard 'missing.safetensors', which holds \"x\", is not in folder");
  writeIndex(d, R"("a": "../s1.safetensors")");
  EXPECT_CONTAINS(sourceError(d.string()), "weight_map puts tensor \"a\" in \"../s1.safetensors\", which is not a file name inside the folder");
  writeIndex(d, R"("a": "..")");
  EXPECT_CONTAINS(sourceError(d.string()), "which is not a file name inside the folder");
  writeIndex(d, R"("a": "/etc/passwd")");
  EXPECT_CONTAINS(sourceError(d.string()), "which is not a file name inside the folder");
  writeIndex(d, R"("a": "s1.safetensors", "b": "s2.safetensors")");
  EXPECT_CONTAINS(sourceError(d.string()), "tensor \"b\" is in two shards, '" + (d / "s1.safetensors").string() + "' and '" +
                                               (d / "s2.safetensors").string() + "'");
  writeIndex(d, R"("a": "s2.safetensors")");
  EXPECT_CONTAINS(sourceError(d.string()), "weight_map puts \"a\" in 's2.safetensors', which has no tensor of that name");
  writeIndex(d, R"("a": "s1.safetensors", "a": "s1.safetensors")");
  EXPECT_CONTAINS(sourceError(d.string()), "weight_map lists \"a\" twice");
  writeIndex(d, R"("a": 3)");
  EXPECT_CONTAINS(sourceError(d.string()), "weight_map gives tensor \"a\" the integer 3, not a shard file name");
  writeBytes(index, R"({"metadata": {}})");
  EXPECT_CONTAINS(sourceError(d.string()), "it has no \"weight_map\" object");
  writeBytes(index, "{not json");
  EXPECT_CONTAINS(sourceError(d.string()), "index '" + index + "': it is not valid JSON");
  // A bad shard's own message names the shard.
  writeBytes(d / "s3.safetensors", "garbage!garbage!");
  writeIndex(d, R"("a": "s3.safetensors")");
  EXPECT_CONTAINS(sourceError(d.string()), "safetensors file '" + (d / "s3.safetensors").string() + "'");
}

// --- writeSafetensorsFolder -------------------------------------------------------------

std::vector<SafetensorsEntry> threeOf400() {
  return {entry("layer.0", "F32", {100}, pattern(400, 1)), entry("layer.1", "F32", {10, 10}, pattern(400, 2)),
          entry("layer.2", "I32", {100}, pattern(400, 3))};
}

TEST_F(SafetensorsTest, FolderShardsGreedilyAndWritesTheIndex) {
  const fs::path out = dir_ / "out" / "nested";  // created
  const auto written = writeSafetensorsFolder(out.string(), threeOf400(), 1000);
  EXPECT_EQ(written, (std::vector<std::string>{(out / "model-00001-of-00002.safetensors").string(),
                                               (out / "model-00002-of-00002.safetensors").string(),
                                               (out / "model.safetensors.index.json").string()}));
  EXPECT_EQ(namesIn(out), (std::set<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                                 "model.safetensors.index.json"}));
  EXPECT_EQ(readAll(out / "model.safetensors.index.json"),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_parameters\": 300,\n"
            "    \"total_size\": 1200\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"layer.0\": \"model-00001-of-00002.safetensors\",\n"
            "    \"layer.1\": \"model-00001-of-00002.safetensors\",\n"
            "    \"layer.2\": \"model-00002-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
  const auto shard1 = SafetensorsFile::open((out / "model-00001-of-00002.safetensors").string());
  EXPECT_EQ(shard1->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(shard1->tensors().size(), 2u);
  EXPECT_EQ(bytesOf(*shard1->find("layer.1")), pattern(400, 2));
  const SafetensorsSource source = SafetensorsSource::open(out.string());
  EXPECT_EQ(source.names(), (std::vector<std::string>{"layer.0", "layer.1", "layer.2"}));
  EXPECT_EQ(bytesOf(*source.find("layer.2")), pattern(400, 3));
  EXPECT_EQ(source.find("layer.1")->shape, (std::vector<std::int64_t>{10, 10}));

  // Everything fits: model.safetensors alone; the index and shards of the
  // earlier save go (readers would take them for this one).
  writeBytes(out / "model-00007-of-00009.safetensors", "stale");
  writeBytes(out / "notes.txt", "kept");
  const auto single = writeSafetensorsFolder(out.string(), threeOf400(), 1200);
  EXPECT_EQ(single, std::vector<std::string>{(out / "model.safetensors").string()});
  EXPECT_EQ(namesIn(out), (std::set<std::string>{"model.safetensors", "notes.txt"}));
  EXPECT_EQ(SafetensorsSource::open(out.string()).names().size(), 3u);

  // Sharded again: the single file goes, or it would shadow the index.
  writeSafetensorsFolder(out.string(), threeOf400(), 500);
  EXPECT_EQ(namesIn(out), (std::set<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                                 "model-00003-of-00003.safetensors", "model.safetensors.index.json",
                                                 "notes.txt"}));
}

TEST_F(SafetensorsTest, ATensorOverTheLimitGetsItsOwnShard) {
  // huggingface_hub lists the big tensor's shard at once, before the one
  // being filled: [huge], [a, b].
  std::vector<SafetensorsEntry> entries = {entry("a", "U8", {400}, pattern(400, 1)),
                                           entry("huge", "U8", {5000}, pattern(5000, 2)),
                                           entry("b", "U8", {400}, pattern(400, 3))};
  const fs::path out = dir_ / "big";
  const auto written = writeSafetensorsFolder(out.string(), entries, 1000);
  EXPECT_EQ(written, (std::vector<std::string>{(out / "model-00001-of-00002.safetensors").string(),
                                               (out / "model-00002-of-00002.safetensors").string(),
                                               (out / "model.safetensors.index.json").string()}));
  const auto huge = SafetensorsFile::open((out / "model-00001-of-00002.safetensors").string());
  ASSERT_EQ(huge->tensors().size(), 1u);
  EXPECT_EQ(huge->tensors()[0].name, "huge");
  EXPECT_EQ(bytesOf(huge->tensors()[0]), pattern(5000, 2));
  const auto rest = SafetensorsFile::open((out / "model-00002-of-00002.safetensors").string());
  ASSERT_EQ(rest->tensors().size(), 2u);
  EXPECT_EQ(rest->tensors()[0].name, "a");
  EXPECT_EQ(rest->tensors()[1].name, "b");
  const std::string index = readAll(out / "model.safetensors.index.json");
  EXPECT_CONTAINS(index, "\"huge\": \"model-00001-of-00002.safetensors\"");
  EXPECT_CONTAINS(index, "\"total_size\": 5800");

  // Nothing to write is one empty model.safetensors.
  EXPECT_EQ(writeSafetensorsFolder((dir_ / "none").string(), {}, 1000),
            std::vector<std::string>{(dir_ / "none" / "model.safetensors").string()});
  EXPECT_TRUE(SafetensorsSource::open((dir_ / "none").string()).names().empty());
}

// --- with Python's safetensors and huggingface_hub -------------------------------------

// Runs Python snippets with PIPEFORGE_PYTHON; skips (saying why) where that
// Python lacks safetensors, torch or huggingface_hub.
class SafetensorsPythonTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
#ifdef PIPEFORGE_TEST_HAS_BUILD_PATHS
    python_ = PIPEFORGE_PYTHON;
#endif
    if (python_.empty()) GTEST_SKIP() << "this build has no PIPEFORGE_PYTHON (configured without LibTorch)";
    // Asked once per run: importing torch takes a second.
    static const testing::CommandResult probe =
        testing::runCommand("'" + python_ + "' -c 'import safetensors, torch, huggingface_hub'");
    if (probe.exit_code != 0) {
      GTEST_SKIP() << python_ << " cannot import safetensors, torch and huggingface_hub: " << probe.output;
    }
  }
  // Runs `script` with `arg`; its output, after asserting it exited 0.
  std::string python(const std::string& script, const std::string& arg) {
    const fs::path file = dir_ / "script.py";
    writeBytes(file, script);
    const auto result = testing::runCommand("'" + python_ + "' '" + file.string() + "' '" + arg + "'");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
  }
  std::string python_;
};

TEST_F(SafetensorsPythonTest, ReadsWhatSaveFileWritesAndWritesTheSameBytes) {
  const std::string file = path("python.safetensors");
  python(R"(
import sys, torch
from safetensors.torch import save_file
save_file({
    "w32": (torch.arange(6, dtype=torch.float32) / 4).reshape(2, 3),
    "wbf": torch.tensor([1.0, -2.5, 3.140625], dtype=torch.bfloat16),
    "i64": torch.tensor([[-1, 2**40]], dtype=torch.int64),
    "scalar": torch.tensor(7.5),
    "empty": torch.zeros(0, 3),
}, sys.argv[1], metadata={"format": "pt"})
)",
         file);
  const auto st = SafetensorsFile::open(file);
  EXPECT_EQ(st->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const SafetensorsTensor* w32 = st->find("w32");
  ASSERT_NE(w32, nullptr);
  EXPECT_EQ(w32->dtype, "F32");
  EXPECT_EQ(w32->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(bytesOf(*w32), floats({0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f}));
  const SafetensorsTensor* wbf = st->find("wbf");
  ASSERT_NE(wbf, nullptr);
  EXPECT_EQ(wbf->dtype, "BF16");
  EXPECT_EQ(wbf->shape, std::vector<std::int64_t>{3});
  EXPECT_EQ(bytesOf(*wbf), std::string("\x80\x3f\x20\xc0\x49\x40", 6));
  const SafetensorsTensor* i64 = st->find("i64");
  ASSERT_NE(i64, nullptr);
  EXPECT_EQ(i64->dtype, "I64");
  EXPECT_EQ(i64->shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(bytesOf(*i64), std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x01\x00\x00", 16));
  ASSERT_NE(st->find("scalar"), nullptr);
  EXPECT_TRUE(st->find("scalar")->shape.empty());
  EXPECT_EQ(bytesOf(*st->find("scalar")), floats({7.5f}));
  ASSERT_NE(st->find("empty"), nullptr);
  EXPECT_EQ(st->find("empty")->shape, (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(st->find("empty")->nbytes, 0u);

  // The same tensors, written here: the same file, byte for byte (Note [Safetensors]).
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : st->tensors()) entries.push_back(entry(t.name, t.dtype, t.shape, bytesOf(t)));
  const std::string ours = path("ours.safetensors");
  writeSafetensors(ours, entries);
  EXPECT_EQ(readAll(ours), readAll(file));
}

TEST_F(SafetensorsPythonTest, LoadFileReadsWhatWeWrite) {
  const std::string file = path("ours.safetensors");
  writeSafetensors(file, {entry("f32", "F32", {2, 2}, floats({1.5f, -2.0f, 0.25f, 1024.0f})),
                          entry("bf16", "BF16", {3}, std::string("\x80\x3f\x20\xc0\x49\x40", 6)),
                          entry("i64", "I64", {2}, std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x01\x00\x00", 16)),
                          entry("flags", "BOOL", {2}, std::string("\x01\x00", 2)),
                          entry("scalar", "F64", {}, std::string("\x00\x00\x00\x00\x00\x00\xe0\x3f", 8)),
                          entry("none", "U8", {0}, "")},
                   {{"format", "pt"}, {"step", "7"}});
  const std::string out = python(R"(
import sys
from safetensors import safe_open
from safetensors.torch import load_file
tensors = load_file(sys.argv[1])
for name in sorted(tensors):
    t = tensors[name]
    print(name, str(t.dtype), list(t.shape), t.tolist())
with safe_open(sys.argv[1], "pt") as f:
    print("metadata", sorted(f.metadata().items()))
)",
                                 file);
  EXPECT_EQ(out,
            "bf16 torch.bfloat16 [3] [1.0, -2.5, 3.140625]\n"
            "f32 torch.float32 [2, 2] [[1.5, -2.0], [0.25, 1024.0]]\n"
            "flags torch.bool [2] [True, False]\n"
            "i64 torch.int64 [2] [-1, 1099511627776]\n"
            "none torch.uint8 [0] []\n"
            "scalar torch.float64 [] 0.5\n"
            "metadata [('format', 'pt'), ('step', '7')]\n");
}

TEST_F(SafetensorsPythonTest, HuggingfaceHubLoadsOurShardsAndPlansTheSameSplit) {
  std::string a, b, c;
  for (int i = 0; i < 100; ++i) {
    const float fa = static_cast<float>(i) * 0.5f, fb = static_cast<float>(i - 50);
    const std::int32_t ic = i * 3 - 7;
    a.append(reinterpret_cast<const char*>(&fa), 4);
    b.append(reinterpret_cast<const char*>(&fb), 4);
    c.append(reinterpret_cast<const char*>(&ic), 4);
  }
  const fs::path out = dir_ / "hf";
  writeSafetensorsFolder(out.string(),
                         {entry("a", "F32", {100}, a), entry("b", "F32", {10, 10}, b), entry("c", "I32", {100}, c)},
                         1000);
  ASSERT_TRUE(fs::exists(out / "model.safetensors.index.json"));
  const std::string printed = python(R"(
import json, sys, torch
from huggingface_hub import load_torch_model, split_torch_state_dict_into_shards
folder = sys.argv[1]
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(100))
        self.b = torch.nn.Parameter(torch.zeros(10, 10))
        self.register_buffer("c", torch.zeros(100, dtype=torch.int32))
m = M()
load_torch_model(m, folder, strict=True)
i = torch.arange(100)
print("a", torch.equal(m.a.data, i.float() * 0.5))
print("b", torch.equal(m.b.data, (i - 50).float().reshape(10, 10)))
print("c", torch.equal(m.c, (i * 3 - 7).to(torch.int32)))
split = split_torch_state_dict_into_shards({"a": m.a, "b": m.b, "c": m.c}, max_shard_size=1000)
index = json.load(open(folder + "/model.safetensors.index.json"))
print("plan", split.tensor_to_filename == index["weight_map"], split.metadata["total_size"] == index["metadata"]["total_size"])
)",
                                     out.string());
  EXPECT_EQ(printed, "a True\nb True\nc True\nplan True True\n");
}

}  // namespace
}  // namespace pipeforge
