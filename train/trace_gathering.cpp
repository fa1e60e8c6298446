#include "train/trace_gathering.h"

#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"

namespace pipeforge::train {
namespace {

std::string traceKey(int rank) { return fmt::format("trace/{}", rank); }

}  // namespace

TraceGathering::TraceGathering(RankChannel& channel, int rank, int world_size)
    : channel_(channel), rank_(rank), world_size_(world_size) {}

void TraceGathering::publish() {
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& p : steps_) mine.push_back(profileToJson(p));
  channel_.publish(traceKey(rank_), mine.dump());
}

bool TraceGathering::write(const std::string& path) {
  std::vector<RankStepProfile> all;
  for (int r = 0; r < world_size_; ++r) {
    const std::string key = traceKey(r);
    const std::string text = channel_.takeFrom(r, key);
    try {
      for (const auto& p : nlohmann::json::parse(text)) all.push_back(profileFromJson(p));
    } catch (const std::exception& e) {  // bad JSON, action text or span kind
      std::cerr << fmt::format("warning: no trace written: the store key '{}' holds a malformed profile ({})\n",
                               channel_.keyName(key), e.what());
      return false;
    }
  }
  writeFileAtomically(path, measuredTraceText(all, world_size_));
  return true;
}

}  // namespace pipeforge::train
