#include "common/error.h"

#include <exception>
#include <filesystem>
#include <ios>
#include <new>

namespace pipeforge {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kUserInput:
      return "user input";
    case ErrorCode::kIo:
      return "I/O";
    case ErrorCode::kPeerFailure:
      return "peer failure";
    case ErrorCode::kInternal:
      return "internal";
    case ErrorCode::kUsage:
      return "command line";
  }
  return "internal";
}

ErrorCode errorCodeForExitStatus(int status) {
  for (ErrorCode code : {ErrorCode::kUserInput, ErrorCode::kIo, ErrorCode::kPeerFailure, ErrorCode::kInternal, ErrorCode::kUsage}) {
    if (exitStatusFor(code) == status) return code;
  }
  return ErrorCode::kInternal;
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code), message_(message), what_(message) {}

Error& Error::addContext(const std::string& context) {
  if (context.empty()) return *this;
  context_.insert(context_.begin(), context);
  what_ = context + ": " + what_;
  return *this;
}

ErrorCode codeOf(const std::exception& e, ErrorCode other) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->code();
  // Out of memory: the run asked for more than the machine has; a smaller
  // batch or model is the fix.
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) return ErrorCode::kUserInput;
  // The standard library's own reports of a failed file operation.
  if (dynamic_cast<const std::filesystem::filesystem_error*>(&e) != nullptr) return ErrorCode::kIo;
  if (dynamic_cast<const std::ios_base::failure*>(&e) != nullptr) return ErrorCode::kIo;
  return other;
}

void rethrowWithContext(const std::string& context, ErrorCode other) {
  try {
    throw;
  } catch (Error& e) {
    e.addContext(context);
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(codeOf(e, other), e.what()).addContext(context);
  }
}

namespace detail {

void failCheck(const char* file, int line, const char* condition, const std::string& message) {
  // Only the last two parts of the path: "stage/stage_dataflow.cpp".
  std::string where = file;
  const std::size_t last = where.rfind('/');
  if (last != std::string::npos && last > 0) {
    const std::size_t before = where.rfind('/', last - 1);
    if (before != std::string::npos) where = where.substr(before + 1);
  }
  std::string text = "internal error at " + where + ":" + std::to_string(line);
  if (condition != nullptr) text += std::string(" (") + condition + " failed)";
  text += ": " + message + "; this is a bug in Pipeforge, please report it";
  throw Error(ErrorCode::kInternal, text);
}

}  // namespace detail

}  // namespace pipeforge
