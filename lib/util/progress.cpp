#include "util/progress.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdlib>
#include <string>

#include "util/error.h"
#include "util/mpi_launcher.h"

namespace dawnpiper {

namespace {
std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%" PRId64 ":%02" PRId64 ":%02" PRId64, s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%" PRId64 ":%02" PRId64, s / 60, s % 60);
  return buf;
}
}  // namespace

Progress::Progress(int64_t first_step, int64_t steps, double samples_per_step, bool quiet, ProgressKind style,
                   std::FILE* out)
    : first_(first_step),
      steps_(steps),
      samples_per_step_(samples_per_step),
      quiet_(quiet),
      terminal_(style == ProgressKind::Bar ||
                (style == ProgressKind::Auto && isatty(fileno(out)) && !under_mpi_launcher())),
      out_(out),
      start_(Clock::now()),
      last_(start_) {}

double Progress::samples_per_second() const {
  const double s = std::chrono::duration<double>(last_ - start_).count();
  return s > 0 ? samples_per_step_ * static_cast<double>(done_) / s : 0;
}

double Progress::steady_samples_per_second() const {
  const double s = std::chrono::duration<double>(last_ - first_done_).count();
  return done_ >= 2 && s > 0 ? samples_per_step_ * static_cast<double>(done_ - 1) / s : samples_per_second();
}

void Progress::step(int64_t step, double loss, double lr, double grad_norm) {
  const auto now = Clock::now();
  const double step_s = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  last_step_s_ = step_s;
  last_loss_ = loss;
  if (++done_ == 1) first_done_ = now;
  if (quiet_) return;
  const int64_t total = steps_ - first_;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double eta = done_ > 0 ? elapsed / static_cast<double>(done_) * static_cast<double>(total - done_) : 0;
  char extra[64] = "";
  if (std::isfinite(lr) && std::isfinite(grad_norm))
    std::snprintf(extra, sizeof extra, " lr %.4g grad-norm %.4g", lr, grad_norm);
  else if (std::isfinite(lr))
    std::snprintf(extra, sizeof extra, " lr %.4g", lr);
  if (terminal_) {
    const int width = 24;
    const int filled = total > 0 ? static_cast<int>(width * done_ / total) : width;
    std::fprintf(out_, "\r[%s%s] step %" PRId64 "/%" PRId64 "  loss %.6g %s %.1f samples/s  ETA %s ",
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), step + 1, steps_, loss,
                 extra, samples_per_second(), duration_text(eta).c_str());
  } else {
    std::fprintf(out_, "step %" PRId64 " loss %.9g time %.3fs %.1f samples/s eta %s%s\n", step, loss, step_s,
                 samples_per_second(), duration_text(eta).c_str(), extra);
  }
  std::fflush(out_);
}

void Progress::validation(int64_t step, double loss) {
  if (quiet_) return;
  std::fprintf(out_, "%svalidation step %" PRId64 " loss %.9g\n", terminal_ ? "\n" : "", step, loss);
  std::fflush(out_);
}

void Progress::finish() {
  if (!quiet_ && terminal_ && done_ > 0) std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace dawnpiper
