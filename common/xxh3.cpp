#include "common/xxh3.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"

namespace pipeforge {

struct Xxh3Digest::State {
  XXH3_state_t* state = XXH3_createState();
  ~State() { XXH3_freeState(state); }
};

Xxh3Digest::Xxh3Digest() : state_(std::make_unique<State>()) {
  if (state_->state == nullptr || XXH3_128bits_reset(state_->state) != XXH_OK) {
    throw Error(ErrorCode::kInternal, "xxHash cannot start an XXH3-128 digest");
  }
}

Xxh3Digest::~Xxh3Digest() = default;

void Xxh3Digest::update(const void* data, std::size_t size) { XXH3_128bits_update(state_->state, data, size); }

std::string Xxh3Digest::hex() const {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(state_->state));
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char byte : canonical.digest) {
    out += kHex[byte >> 4];
    out += kHex[byte & 15];
  }
  return out;
}

std::string xxh3OfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot read '" + path + "': " + std::strerror(errno));
  Xxh3Digest digest;
  std::vector<char> buffer(4u << 20);
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(ErrorCode::kIo, "error reading '" + path + "': " + std::strerror(err));
    }
    if (n == 0) break;
    digest.update(buffer.data(), static_cast<std::size_t>(n));
  }
  ::close(fd);
  return digest.hex();
}

bool isXxh3(const std::string& text) {
  if (text.size() != 32) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace pipeforge
