#include "train/rank_channel.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <stdexcept>

#include <fmt/format.h>

namespace pipeforge::train {

class RankChannel::Store {
 public:
  Store(const runtime::DistEnv& env, std::chrono::milliseconds timeout) : timeout_(timeout) {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(env.master_port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    store_ = c10::make_intrusive<c10d::PrefixStore>("pipeforge/train", tcp);
    where_ = fmt::format("{}:{}", env.master_addr, env.master_port);
  }

  void set(const std::string& key, const std::string& value) {
    store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }

  std::string take(const std::string& key) {
    try {
      store_->wait({key}, timeout_);
      auto bytes = store_->get(key);
      store_->deleteKey(key);
      return std::string(bytes.begin(), bytes.end());
    } catch (const c10::Error& e) {
      throw std::runtime_error(fmt::format("no value for '{}' from the other ranks within {} s (store {}): {}", key,
                                           timeout_.count() / 1000.0, where_, e.what_without_backtrace()));
    }
  }

 private:
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string where_;
};

RankChannel::RankChannel(const runtime::DistEnv& env, std::chrono::milliseconds timeout) {
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

std::string RankChannel::take(const std::string& key) {
  if (store_) return store_->take(key);
  auto it = local_.find(key);
  if (it == local_.end()) throw std::runtime_error(fmt::format("no value for '{}' (single process)", key));
  std::string value = std::move(it->second);
  local_.erase(it);
  return value;
}

}  // namespace pipeforge::train
