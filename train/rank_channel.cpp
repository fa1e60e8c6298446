#include "train/rank_channel.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <stdexcept>

#include <fmt/format.h>

#include "common/error.h"
#include "compat/c10d_store.h"

namespace pipeforge::train {

class RankChannel::Store {
 public:
  Store(const runtime::DistEnv& env, std::chrono::milliseconds timeout) : timeout_(timeout) {
    compat::StoreEndpoint endpoint;
    endpoint.host = env.master_addr;
    endpoint.port = env.master_port;
    endpoint.world_size = env.world_size;
    endpoint.timeout = timeout;
    endpoint.private_dir = env.private_dir;
    prefix_ = env.storePrefix() + "/train";
    store_ = c10::make_intrusive<c10d::PrefixStore>(prefix_, compat::openStore(endpoint));
    where_ = compat::describeStore(endpoint);
  }

  const std::string& prefix() const { return prefix_; }

  void set(const std::string& key, const std::string& value) {
    store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }

  // `from`: who was to write it, or empty when any rank might have.
  std::string take(const std::string& key, const std::string& from) {
    try {
      store_->wait({key}, timeout_);
      auto bytes = store_->get(key);
      store_->deleteKey(key);
      return std::string(bytes.begin(), bytes.end());
    } catch (const c10::Error& e) {
      if (from.empty()) {
        throw Error(ErrorCode::kPeerFailure,
                    fmt::format("no value for '{}' from the other ranks within {} s (store {}): {}", key,
                                timeout_.count() / 1000.0, where_, e.what_without_backtrace()));
      }
      throw Error(ErrorCode::kPeerFailure,
                  fmt::format("{} wrote no '{}' within {} s: it has stopped, or lost its link to the store {} "
                              "(its own output says why): {}",
                              from, key, timeout_.count() / 1000.0, where_, e.what_without_backtrace()));
    }
  }

 private:
  std::chrono::milliseconds timeout_;
  std::string prefix_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string where_;
};

RankChannel::RankChannel(const runtime::DistEnv& env, std::chrono::milliseconds timeout,
                         std::function<std::string(int)> describe_rank)
    : describe_rank_(std::move(describe_rank)) {
  if (env.world_size > 1) store_ = std::make_unique<Store>(env, timeout);
}

RankChannel::~RankChannel() = default;

void RankChannel::publish(const std::string& key, const std::string& value) {
  if (store_) {
    store_->set(key, value);
    return;
  }
  local_[key] = value;
}

std::string RankChannel::keyName(const std::string& key) const {
  return store_ ? store_->prefix() + "/" + key : key;
}

std::string RankChannel::describe(int rank) const {
  return describe_rank_ ? describe_rank_(rank) : fmt::format("rank {}", rank);
}

std::string RankChannel::takeFrom(int from, const std::string& key) {
  if (store_) return store_->take(key, describe(from));
  return take(key);
}

std::string RankChannel::take(const std::string& key) {
  if (store_) return store_->take(key, "");
  auto it = local_.find(key);
  PIPEFORGE_CHECK(it != local_.end(), fmt::format("no value for '{}' (single process)", key));
  std::string value = std::move(it->second);
  local_.erase(it);
  return value;
}

double RankChannel::takeNumber(const std::string& key) {
  const std::string text = take(key);
  std::size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw Error(ErrorCode::kPeerFailure,
                fmt::format("the store key '{}' holds '{}', not a number: another program wrote into this job's "
                            "rendezvous store (README, Security)",
                            keyName(key), text.substr(0, 60)));
  }
  return value;
}

}  // namespace pipeforge::train
