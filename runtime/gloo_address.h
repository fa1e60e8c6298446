// Which local address a rank's Gloo device binds to (Note [Which address Gloo
// binds]). Torch-free: the process group turns the choice into a device.
#pragma once

#include <string>
#include <vector>

#include "runtime/dist_env.h"

namespace pipeforge::runtime {

struct GlooBinding {
  std::vector<std::string> interfaces;  // GLOO_SOCKET_IFNAME's, each present on this host
  std::string address;                  // else: the one address to bind
  std::string why;                      // "GLOO_SOCKET_IFNAME=eth1", "the route to MASTER_ADDR 10.0.0.1", ...
};

// GLOO_SOCKET_IFNAME when set (every name must be an interface of this host);
// else 127.0.0.1 when MASTER_ADDR is a loopback address; else the local
// address of the interface whose route reaches MASTER_ADDR. Throws
// DistEnvError naming the variable and the fix when an interface is missing
// or no route reaches MASTER_ADDR.
GlooBinding chooseGlooBinding(const DistEnv& env);

// The IPv4 address other hosts reach this one at, as far as this host can
// tell without sending anything: the default route's interface's, else the
// first non-loopback interface's that is up; "" when there is none.
std::string hostAddressForOthers();

// The local address this host sends from to reach `host` (a name or an
// address): a UDP socket connected to it, which sends nothing. Throws
// DistEnvError when `host` does not resolve or no route reaches it.
std::string localAddressToward(const std::string& host);

}  // namespace pipeforge::runtime
