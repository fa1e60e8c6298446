#include "train/progress_bar.h"

#include <unistd.h>

#include <cmath>

#include <fmt/format.h>

namespace pipeforge::train {

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<std::int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

namespace {

std::string formatRate(double per_s) {
  if (per_s >= 1e6) return fmt::format("{:.1f}M", per_s / 1e6);
  if (per_s >= 1e3) return fmt::format("{:.1f}k", per_s / 1e3);
  return fmt::format("{:.0f}", per_s);
}

}  // namespace

std::string formatProgress(const StepReport& r, std::int64_t total, int bar_width) {
  std::string line;
  if (bar_width > 0) {
    const auto filled = total > 0 ? static_cast<int>(bar_width * r.step / total) : 0;
    line = "[" + std::string(filled, '#') + std::string(bar_width - filled, '.') + "]  ";
  }
  const int digits = static_cast<int>(std::to_string(total).size());
  line += fmt::format("{:>{}}/{}  loss {:.4f}  lr {:.2e}", r.step, digits, total, r.loss, r.lr);
  if (r.grad_norm) line += fmt::format("  gnorm {:.3g}", *r.grad_norm);
  line += fmt::format("  {} {}  ETA {}", formatRate(r.throughput), r.unit, formatDuration(r.eta_s));
  return line;
}

bool stdoutIsTerminal() { return ::isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(std::ostream& out, std::int64_t total_steps, bool tty)
    : out_(out), total_(total_steps), tty_(tty) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(const StepReport& report) {
  if (!tty_) {
    out_ << "step " << formatProgress(report, total_, 0) << "\n" << std::flush;
    return;
  }
  last_ = formatProgress(report, total_, 20);
  out_ << "\r" << last_ << "\x1b[K" << std::flush;
  drawn_ = true;
}

void ProgressBar::note(const std::string& line) {
  if (!tty_) {
    out_ << line << "\n" << std::flush;
    return;
  }
  out_ << "\r" << line << "\x1b[K\n";
  if (drawn_) out_ << last_;
  out_ << std::flush;
}

void ProgressBar::finish() {
  if (tty_ && drawn_) out_ << "\n" << std::flush;
  drawn_ = false;
}

}  // namespace pipeforge::train
