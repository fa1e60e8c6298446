#include "runtime/gloo_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

// Note [Which address Gloo binds]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every rank's Gloo device listens on one address and publishes it in the
// store; the others connect to it. Gloo's default device binds to the address
// the host name resolves to, which on many Debian and Ubuntu machines is
// 127.0.1.1 (/etc/hosts): ranks on two hosts then never connect
// ("connectFullMesh failed ... Connect timeout"). So a rank picks, in order:
//   1. GLOO_SOCKET_IFNAME, as PyTorch documents it (comma-separated names;
//      one device per interface), each checked to exist on this host;
//   2. 127.0.0.1 when MASTER_ADDR is a loopback address (a one-host job);
//   3. the local address of the interface whose route reaches MASTER_ADDR:
//      a UDP socket connect()ed to MASTER_ADDR (which sends no packet) tells,
//      by getsockname(), the source address the kernel would use. Rank 0 on
//      the MASTER_ADDR host gets that address itself. When MASTER_ADDR is a
//      name of this host that resolves to loopback here (torchrun's c10d
//      rendezvous hands its workers the host name), the route is loopback,
//      which no other host reaches: the address of the default route's
//      interface is taken instead, else of the first interface that is up.
// Never a wildcard address: a device bound to 0.0.0.0 would listen on every
// interface of the host, and the store already binds to MASTER_ADDR only
// (Note [Store exposure]). Never loopback unless MASTER_ADDR is loopback.

namespace pipeforge::runtime {

std::string localAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw DistEnvError(fmt::format("MASTER_ADDR '{}' does not resolve ({}); give an address or a name every host "
                                   "resolves, or set GLOO_SOCKET_IFNAME to the interface the ranks share",
                                   host, ::gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      ::close(fd);
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) {
        ::freeaddrinfo(found);
        return text;
      }
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  throw DistEnvError(fmt::format("no route from this host reaches MASTER_ADDR '{}' ({}); check the address, or set "
                                 "GLOO_SOCKET_IFNAME to the interface the ranks share",
                                 host, last_error));
}

std::string hostAddressForOthers() {
  // The interface of the default route (/proc/net/route: destination 0), if any.
  std::string preferred;
  {
    std::ifstream routes("/proc/net/route");
    std::string line;
    std::getline(routes, line);  // the header
    while (std::getline(routes, line)) {
      std::istringstream fields(line);
      std::string iface, destination, gateway, flags;
      fields >> iface >> destination >> gateway >> flags;
      if (destination == "00000000" && (std::stoul(flags.empty() ? "0" : flags, nullptr, 16) & 0x1) != 0) {
        preferred = iface;
        break;
      }
    }
  }
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return "";
  std::string first, chosen;
  for (ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text)) == nullptr) {
      continue;
    }
    if (first.empty()) first = text;
    if (chosen.empty() && !preferred.empty() && preferred == i->ifa_name) chosen = text;
  }
  ::freeifaddrs(all);
  return chosen.empty() ? first : chosen;
}

GlooBinding chooseGlooBinding(const DistEnv& env) {
  GlooBinding b;
  if (!env.gloo_interfaces.empty()) {
    for (const std::string& name : env.gloo_interfaces) {
      if (::if_nametoindex(name.c_str()) != 0) continue;
      std::vector<std::string> present;
      if (struct if_nameindex* all = ::if_nameindex()) {
        for (auto* i = all; i->if_index != 0; ++i) present.emplace_back(i->if_name);
        ::if_freenameindex(all);
      }
      throw DistEnvError(fmt::format("GLOO_SOCKET_IFNAME names interface '{}', which this host lacks (it has {}); "
                                     "set it to the interface that reaches the other hosts, or unset it to use the "
                                     "one whose route reaches MASTER_ADDR",
                                     name, fmt::join(present, ", ")));
    }
    b.interfaces = env.gloo_interfaces;
    b.why = fmt::format("GLOO_SOCKET_IFNAME={}", fmt::join(env.gloo_interfaces, ","));
    return b;
  }
  if (isLoopbackAddress(env.master_addr)) {
    b.address = "127.0.0.1";
    b.why = fmt::format("MASTER_ADDR {} is a loopback address", env.master_addr);
    return b;
  }
  b.address = localAddressToward(env.master_addr);
  b.why = fmt::format("the route to MASTER_ADDR {}", env.master_addr);
  if (isLoopbackAddress(b.address)) {
    // MASTER_ADDR names this host by a name that resolves to loopback here
    // (torchrun's c10d rendezvous passes the host name on): other hosts reach
    // it by its interface address instead.
    if (std::string outward = hostAddressForOthers(); !outward.empty()) {
      b.why = fmt::format("MASTER_ADDR {} is this host, by a name that resolves to {} here; bound to {}, the "
                          "address of the interface other hosts reach",
                          env.master_addr, b.address, outward);
      b.address = outward;
    }
  }
  return b;
}

}  // namespace pipeforge::runtime
