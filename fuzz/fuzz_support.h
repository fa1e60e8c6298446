// What every fuzz target shares: the input as text, and the rule that an
// exception outside the parser's documented error type is a bug.
//
// A target catches exactly the documented error type(s) of its parser and
// calls failOnUndocumentedException() from a `catch (...)` for anything else,
// which names the exception type and aborts so libFuzzer saves the input.
#pragma once

#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <typeinfo>

namespace pipeforge::fuzz {

inline std::string textOf(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

inline std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

// With PIPEFORGE_FUZZ_VERBOSE=1 a target prints why the parser rejected an
// input: handy when checking that seeds reach past the first error.
inline void noteRejected(const char* target, const std::exception& error) {
  static const bool verbose = std::getenv("PIPEFORGE_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "==pipeforge-fuzz== %s: rejected: %s\n", target, error.what());
}

inline void noteAccepted(const char* target) {
  static const bool verbose = std::getenv("PIPEFORGE_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "==pipeforge-fuzz== %s: accepted\n", target);
}

// Call only inside a catch block: reports the exception in flight and aborts.
[[noreturn]] inline void failOnUndocumentedException(const char* target, const char* step) {
  const std::type_info* type = abi::__cxa_current_exception_type();
  std::string what;
  try {
    throw;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::fprintf(stderr, "==pipeforge-fuzz== %s: %s threw an undocumented exception of type %s: %s\n", target, step,
               type ? demangle(type->name()).c_str() : "?", what.c_str());
  std::abort();
}

// A property of the parser (a round trip, an invariant) does not hold.
[[noreturn]] inline void failProperty(const char* target, const std::string& what) {
  std::fprintf(stderr, "==pipeforge-fuzz== %s: property violated: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace pipeforge::fuzz
