#include "train/metrics_log.h"

#include "common/error.h"

namespace pipeforge::train {

MetricsLog::MetricsLog(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw Error(ErrorCode::kIo, "cannot open metrics file '" + path + "' for writing");
}

void MetricsLog::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace pipeforge::train
