// The job's rendezvous store (c10d::Store), opened as narrowly as the LibTorch
// in use allows.
//
// Note [Store exposure]: c10d's TCPStore has no authentication: whoever
// reaches its port can read and write every key, publish a fake failure and
// block a barrier. So the server listens only where the ranks need it:
//   - LibTorch with TCPStoreOptions::masterListenFd (2.x): we bind the socket
//     ourselves to the address MASTER_ADDR names (127.0.0.1 for a local run)
//     and hand it over; nothing listens on a wildcard address.
//   - LibTorch without it (1.13): TCPStore binds every interface. Local runs
//     started by `pipeforge train --nproc` then use a c10d::FileStore in the
//     launcher's private (0700) folder instead: no socket at all. Other runs
//     (torchrun, srun) keep the TCPStore on all interfaces for the life of
//     the job; the README's Security section says so.
#pragma once

#include <chrono>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}  // namespace c10d

namespace pipeforge::compat {

struct StoreEndpoint {
  std::string host;  // MASTER_ADDR
  int port = 0;      // MASTER_PORT
  bool is_server = false;
  int world_size = 1;
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  // A folder private to this job on this machine (a local launch), or empty.
  // Used only where the TCPStore cannot be bound to one address.
  std::string private_dir;
};

// How openStore will reach the store for `endpoint`, in words ("TCPStore
// bound to 127.0.0.1:29500", "FileStore in /tmp/...", ...), for logs and errors.
std::string describeStore(const StoreEndpoint& endpoint);

// True when this LibTorch lets the TCPStore server listen on one address.
bool storeBindsOneAddress();

// Opens (server) or connects to (client) the store. Throws pipeforge::Error
// (kUserInput) naming the address and the fix when the address is not this
// machine's or the port is taken.
c10::intrusive_ptr<c10d::Store> openStore(const StoreEndpoint& endpoint);

}  // namespace pipeforge::compat
