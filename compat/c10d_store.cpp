#include "compat/c10d_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/error.h"

namespace pipeforge::compat {
namespace {

// Feature test, not a version test: TCPStoreOptions::masterListenFd exists
// in recent LibTorch 2.x and not in 1.13.
template <class Options, class = void>
struct HasListenFd : std::false_type {};
template <class Options>
struct HasListenFd<Options, std::void_t<decltype(std::declval<Options&>().masterListenFd)>> : std::true_type {};

template <class Options>
void handOver(Options& options, int fd) {
  if constexpr (HasListenFd<Options>::value) options.masterListenFd = fd;
}

// A listening socket on the first address `host` resolves to that this
// machine owns. Never a wildcard address.
int listenOn(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    throw Error(ErrorCode::kUserInput, fmt::format("MASTER_ADDR '{}' does not resolve ({}); set MASTER_ADDR to this "
                                                   "host's address or name",
                                                   host, ::gai_strerror(rc)));
  }
  std::string errors;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) continue;
    int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) ::setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(s, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s, SOMAXCONN) == 0) {
      fd = s;
      break;
    }
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", std::strerror(errno));
    ::close(s);
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    throw Error(ErrorCode::kUserInput,
                fmt::format("rank 0 cannot listen on {}:{} ({}); rank 0 must run on the host MASTER_ADDR names, and "
                            "MASTER_PORT must be free there",
                            host, port, errors.empty() ? "no usable address" : errors));
  }
  return fd;
}

bool useFileStore(const StoreEndpoint& e) { return !storeBindsOneAddress() && !e.private_dir.empty(); }

std::string fileStorePath(const StoreEndpoint& e) { return e.private_dir + "/store"; }

}  // namespace

bool storeBindsOneAddress() { return HasListenFd<c10d::TCPStoreOptions>::value; }

std::string describeStore(const StoreEndpoint& e) {
  if (useFileStore(e)) return fmt::format("FileStore {}", fileStorePath(e));
  if (storeBindsOneAddress()) return fmt::format("TCPStore at {}:{}", e.host, e.port);
  return fmt::format("TCPStore at {}:{} (this LibTorch listens on all interfaces)", e.host, e.port);
}

c10::intrusive_ptr<c10d::Store> openStore(const StoreEndpoint& e) {
  if (useFileStore(e)) {
    // Every rank opens the same file; -1: nobody removes it, the launcher
    // removes the whole private folder after the run.
    return c10::make_intrusive<c10d::FileStore>(fileStorePath(e), -1);
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(e.port);
  options.isServer = e.is_server;
  options.numWorkers = e.world_size;
  options.waitWorkers = false;
  options.timeout = e.timeout;
  int fd = -1;
  if (e.is_server && storeBindsOneAddress()) {
    fd = listenOn(e.host, e.port);
    handOver(options, fd);
  }
  try {
    return c10::make_intrusive<c10d::TCPStore>(e.host, options);
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
}

}  // namespace pipeforge::compat
