// SHA-256 of files, so a corrupt stage file or checkpoint is caught on load
// instead of training on garbage (Note [File digests]).
//
// Note [File digests]: `pipeforge split` records a digest of every stage file
// in pipe.json, and every checkpoint records the SHA-256 of each of its files
// in meta.json ("files"). Readers verify them before they use a file; a
// manifest or checkpoint written before digests existed has none and is read
// as before.
//
// A stage file's digest is XXH3-128 ("xxh3_128", common/xxh3.h; splits
// before issue 41 wrote "sha256", still verified). A digest here catches a
// corrupt, truncated or swapped file, not a forged one: pipe.json is not
// signed, so SHA-256 never stopped a forger either. XXH3 runs at memory
// speed (over 10 GB/s a core), SHA-256 at 1-2 GB/s, slower than the disk: it
// alone kept a split from writing stage files at the disk's speed (Note
// [Stage files at the disk's speed] in common/torch_zip.h), and every rank's
// start-up from checking 5 GB of stages in under a second. Checkpoints,
// written once per save, keep SHA-256.
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
// verifyXxh3Digest: the same for an XXH3-128 digest.
void verifyFileDigest(const std::string& path, const std::string& expected, const std::string& what,
                      const std::string& fix);
void verifyXxh3Digest(const std::string& path, const std::string& expected, const std::string& what,
                      const std::string& fix);

}  // namespace pipeforge::stage
