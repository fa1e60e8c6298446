// pipeforge::Error: codes, context chaining, what(), checks, and the exit
// status each code maps to.
#include "common/error.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <new>
#include <stdexcept>
#include <string>

namespace pipeforge {
namespace {

// A layer's error class, as the layers declare theirs (train::ConfigError, ...).
class LayerError : public Error {
 public:
  explicit LayerError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

TEST(ErrorTest, CarriesItsCodeAndMessage) {
  const Error e(ErrorCode::kIo, "cannot write 'x'");
  EXPECT_EQ(e.code(), ErrorCode::kIo);
  EXPECT_EQ(e.message(), "cannot write 'x'");
  EXPECT_STREQ(e.what(), "cannot write 'x'");
  EXPECT_TRUE(e.context().empty());
  // Existing `catch (const std::runtime_error&)` sites keep catching it.
  const std::runtime_error& base = e;
  EXPECT_STREQ(base.what(), "cannot write 'x'");
}

TEST(ErrorTest, ContextIsPrependedOutermostFirst) {
  Error e(ErrorCode::kUserInput, "stage 1 forward failed");
  e.addContext("training step 3 of 10").addContext("rank 1");
  EXPECT_STREQ(e.what(), "rank 1: training step 3 of 10: stage 1 forward failed");
  EXPECT_EQ(e.message(), "stage 1 forward failed");
  ASSERT_EQ(e.context().size(), 2u);
  EXPECT_EQ(e.context()[0], "rank 1");
  EXPECT_EQ(e.context()[1], "training step 3 of 10");
  e.addContext("");
  EXPECT_STREQ(e.what(), "rank 1: training step 3 of 10: stage 1 forward failed");
}

TEST(ErrorTest, ExitStatusPerCode) {
  struct Case {
    ErrorCode code;
    int status;
    const char* name;
  };
  for (const Case& c : {Case{ErrorCode::kUserInput, 1, "user input"}, Case{ErrorCode::kIo, 3, "I/O"},
                        Case{ErrorCode::kPeerFailure, 4, "peer failure"}, Case{ErrorCode::kInternal, 70, "internal"},
                        Case{ErrorCode::kUsage, 2, "command line"}}) {
    EXPECT_EQ(exitStatusFor(c.code), c.status) << c.name;
    EXPECT_EQ(errorCodeForExitStatus(c.status), c.code) << c.name;
    EXPECT_STREQ(errorCodeName(c.code), c.name);
  }
  EXPECT_EQ(errorCodeForExitStatus(139), ErrorCode::kInternal);
}

// Rethrows what `fn` throws with context, as the trainer and launcher do.
template <class Fn>
void rethrowing(const std::string& context, Fn fn) {
  try {
    fn();
  } catch (...) {
    rethrowWithContext(context);
  }
}

TEST(ErrorTest, RethrowWithContextKeepsClassAndCode) {
  try {
    rethrowing("rank 1", [] {
      rethrowing("training step 2 of 4", [] { throw LayerError("bad batch", ErrorCode::kPeerFailure); });
    });
    FAIL() << "no error";
  } catch (const LayerError& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailure);
    EXPECT_STREQ(e.what(), "rank 1: training step 2 of 4: bad batch");
  }
}

TEST(ErrorTest, RethrowWithContextWrapsOtherExceptions) {
  auto caught = [](auto thrower) -> Error {
    try {
      rethrowing("loading stage 2", thrower);
    } catch (const Error& e) {
      return e;
    }
    return Error(ErrorCode::kInternal, "nothing thrown");
  };
  Error internal = caught([] { throw std::logic_error("a broken invariant"); });
  EXPECT_EQ(internal.code(), ErrorCode::kInternal);
  EXPECT_STREQ(internal.what(), "loading stage 2: a broken invariant");
  Error io = caught([] {
    throw std::filesystem::filesystem_error("rename", std::make_error_code(std::errc::permission_denied));
  });
  EXPECT_EQ(io.code(), ErrorCode::kIo);
  // Out of memory passes through unchanged.
  EXPECT_THROW(rethrowing("step", [] { throw std::bad_alloc(); }), std::bad_alloc);
}

TEST(ErrorTest, CodeOfClassifiesForeignExceptions) {
  EXPECT_EQ(codeOf(LayerError("x")), ErrorCode::kUserInput);
  EXPECT_EQ(codeOf(std::bad_alloc()), ErrorCode::kUserInput);
  EXPECT_EQ(codeOf(std::runtime_error("x")), ErrorCode::kInternal);
  EXPECT_EQ(codeOf(std::runtime_error("x"), ErrorCode::kUserInput), ErrorCode::kUserInput);
  EXPECT_EQ(codeOf(std::ios_base::failure("x")), ErrorCode::kIo);
}

TEST(ErrorTest, CheckThrowsInternalWithWhere) {
  EXPECT_NO_THROW(PIPEFORGE_CHECK(1 + 1 == 2, "arithmetic"));
  try {
    const int stages = 2;
    PIPEFORGE_CHECK(stages == 3, "expected 3 stages, got " + std::to_string(stages));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    const std::string what = e.what();
    EXPECT_NE(what.find("internal error at common/error_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("(stages == 3 failed): expected 3 stages, got 2"), std::string::npos) << what;
    EXPECT_NE(what.find("this is a bug in Pipeforge"), std::string::npos) << what;
  }
  try {
    PIPEFORGE_FAIL("unreachable");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("error_test.cpp:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(": unreachable;"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pipeforge
