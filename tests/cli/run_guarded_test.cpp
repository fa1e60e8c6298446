// runGuarded turns each error code into its exit status (Note [Exit
// statuses]) and prints one "pipeforge CMD: error: ..." line.
#include "cli/run_guarded.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <new>
#include <sstream>
#include <stdexcept>

#include "cli/commands.h"
#include "common/error.h"

namespace pipeforge::cli {
namespace {

struct Guarded {
  int status = -1;
  std::string printed;
};

template <class Fn>
Guarded guarded(Fn fn) {
  std::ostringstream err;
  std::streambuf* old = std::cerr.rdbuf(err.rdbuf());
  Guarded out;
  out.status = runGuarded("test", [&]() -> int {
    fn();
    return kExitOk;
  });
  std::cerr.rdbuf(old);
  out.printed = err.str();
  return out;
}

TEST(CliExitStatus, EachErrorCodeHasItsStatus) {
  struct Case {
    ErrorCode code;
    int status;
  };
  for (const Case& c : {Case{ErrorCode::kUserInput, kExitFailure}, Case{ErrorCode::kIo, kExitIo},
                        Case{ErrorCode::kPeerFailure, kExitPeerFailure}, Case{ErrorCode::kInternal, kExitInternal},
                        Case{ErrorCode::kUsage, kExitUsage}}) {
    Guarded g = guarded([&] { throw Error(c.code, "the message").addContext("the context"); });
    EXPECT_EQ(g.status, c.status) << errorCodeName(c.code);
    EXPECT_EQ(g.printed, std::string("pipeforge test: error: the context: the message\n") +
                             (c.code == ErrorCode::kUsage ? "Run `pipeforge test --help` for usage.\n" : ""));
  }
  EXPECT_EQ(kExitFailure, 1);
  EXPECT_EQ(kExitIo, 3);
  EXPECT_EQ(kExitPeerFailure, 4);
  EXPECT_EQ(kExitInternal, 70);
}

TEST(CliExitStatus, ForeignExceptions) {
  Guarded oom = guarded([] { throw std::bad_alloc(); });
  EXPECT_EQ(oom.status, kExitFailure);
  EXPECT_EQ(oom.printed, "pipeforge test: error: out of memory\n");
  Guarded fs_error = guarded([] {
    throw std::filesystem::filesystem_error("cannot rename", std::make_error_code(std::errc::read_only_file_system));
  });
  EXPECT_EQ(fs_error.status, kExitIo);
  // An exception no layer turned into an Error (a torch error, a broken invariant): internal.
  EXPECT_EQ(guarded([] { throw std::logic_error("x"); }).status, kExitInternal);
  EXPECT_EQ(guarded([] { throw 42; }).status, kExitInternal);
  EXPECT_EQ(guarded([] {}).status, kExitOk);
}

}  // namespace
}  // namespace pipeforge::cli
