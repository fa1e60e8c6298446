#include "stage/file_digest.h"

#include <openssl/evp.h>

#include "common/xxh3.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

namespace pipeforge::stage {

namespace {

using DigestContext = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

DigestContext startSha256() {
  DigestContext ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    throw DigestError("OpenSSL cannot start a SHA-256 digest");
  }
  return ctx;
}

std::string finishHex(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx, digest, &size);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < size; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

}  // namespace

std::string sha256OfFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DigestError("cannot read '" + path + "': " + std::strerror(errno));
  DigestContext ctx = startSha256();
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) throw DigestError("error reading '" + path + "'");
  return finishHex(ctx.get());
}

std::string sha256OfBytes(std::string_view bytes) {
  DigestContext ctx = startSha256();
  EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size());
  return finishHex(ctx.get());
}

bool isSha256(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

void verifyFileDigest(const std::string& path, const std::string& expected, const std::string& what,
                      const std::string& fix) {
  if (expected.empty()) return;
  const std::string actual = sha256OfFile(path);
  if (actual != expected) {
    throw DigestError(what + " '" + path + "' is corrupt: its SHA-256 is " + actual + ", but " + expected +
                      " was recorded when it was written; " + fix);
  }
}

void verifyXxh3Digest(const std::string& path, const std::string& expected, const std::string& what,
                      const std::string& fix) {
  if (expected.empty()) return;
  std::string actual;
  try {
    actual = xxh3OfFile(path);
  } catch (const Error& e) {
    throw DigestError(e.what());
  }
  if (actual != expected) {
    throw DigestError(what + " '" + path + "' is corrupt: its XXH3-128 digest is " + actual + ", but " + expected +
                      " was recorded when it was written; " + fix);
  }
}

}  // namespace pipeforge::stage
