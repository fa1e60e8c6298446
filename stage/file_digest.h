// SHA-256 of files, so a corrupt stage file or checkpoint is caught on load
// instead of training on garbage (Note [File digests]).
//
// Note [File digests]: `pipeforge split` records the SHA-256 of every stage
// file in pipe.json ("sha256"), and every checkpoint records the SHA-256 of
// each of its files in meta.json ("files"). Readers verify them before they
// use a file; a manifest or checkpoint written before digests existed has
// none and is read as before.
#pragma once

#include <string>
#include <string_view>

#include "common/error.h"

namespace pipeforge::stage {

class DigestError : public pipeforge::Error {
 public:
  explicit DigestError(const std::string& message, ErrorCode code = ErrorCode::kUserInput) : Error(code, message) {}
};

// Lower-case hex SHA-256 of the file's bytes. Throws DigestError when the
// file cannot be read.
std::string sha256OfFile(const std::string& path);
// The same of bytes in hand.
std::string sha256OfBytes(std::string_view bytes);

// True for 64 lower-case hex digits.
bool isSha256(const std::string& text);

// Throws DigestError naming `what`, both digests and `fix` when the file's
// SHA-256 is not `expected`; does nothing when `expected` is empty.
void verifyFileDigest(const std::string& path, const std::string& expected, const std::string& what,
                      const std::string& fix);

}  // namespace pipeforge::stage
