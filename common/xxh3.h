// XXH3-128 digests of bytes and files (Note [File digests] in
// stage/file_digest.h): what `pipeforge split` records of each stage file.
// The hex is XXH128's canonical form, as `xxh128sum` prints it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace pipeforge {

class Xxh3Digest {
 public:
  Xxh3Digest();
  ~Xxh3Digest();
  Xxh3Digest(const Xxh3Digest&) = delete;
  Xxh3Digest& operator=(const Xxh3Digest&) = delete;

  void update(const void* data, std::size_t size);
  // 32 lower-case hex digits of the bytes so far (the digest can go on).
  std::string hex() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// 32 lower-case hex digits; throws Error(kIo) naming the file when it cannot be read.
std::string xxh3OfFile(const std::string& path);

// True for 32 lower-case hex digits.
bool isXxh3(const std::string& text);

}  // namespace pipeforge
