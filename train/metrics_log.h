// The run's metrics as JSON Lines: one object per event, flushed as written,
// so a crashed run keeps everything up to its last step.
//
//   {"event":"train","step":12,"loss":3.21,"lr":0.00096,"tokens_per_s":5120.0,"step_s":0.21,"elapsed_s":2.6}
//   {"event":"eval","step":50,"loss":2.98}
#pragma once

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace pipeforge::train {

class MetricsLog {
 public:
  // Appends to `path` (a resumed run continues the same file).
  explicit MetricsLog(const std::string& path);

  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace pipeforge::train
