// The line rank 0 shows while training: a bar redrawn in place on a
// terminal, plain lines (one per logged step) when stdout is a file or pipe.
//
//   [########............]  40/100  loss 2.4107  lr 9.5e-04  gnorm 0.83  5.1k tok/s  ETA 0:12
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace pipeforge::train {

struct StepReport {
  std::int64_t step = 0;  // steps done (1-based)
  double loss = 0.0;
  double lr = 0.0;
  double throughput = 0.0;  // per second, in `unit`
  double eta_s = 0.0;
  const char* unit = "tok/s";  // tok/s for token data, rows/s for tensor data
  std::optional<double> grad_norm;  // the pre-clip global gradient norm, when measured
};

class ProgressBar {
 public:
  // `tty`: redraw in place (use isTerminal()); otherwise print lines.
  ProgressBar(std::ostream& out, std::int64_t total_steps, bool tty);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(const StepReport& report);
  // A line of its own (evaluation, checkpoint), keeping the bar below it.
  void note(const std::string& line);
  // Ends the bar's line.
  void finish();

 private:
  std::ostream& out_;
  std::int64_t total_;
  bool tty_;
  bool drawn_ = false;
  std::string last_;
};

// The line for one report, without the carriage return (tests).
std::string formatProgress(const StepReport& report, std::int64_t total_steps, int bar_width);

// "0:42", "1:02:03".
std::string formatDuration(double seconds);

// True when stdout is a terminal.
bool stdoutIsTerminal();

}  // namespace pipeforge::train
