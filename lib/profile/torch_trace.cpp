#include "profile/torch_trace.h"

#include <ATen/Context.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdio>
#include <filesystem>

#include "util/error.h"

namespace dawnpiper {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

TorchTrace::TorchTrace(std::string path, int64_t first, int64_t count)
    : path_(std::move(path)), first_(first), count_(count) {}

TorchTrace::~TorchTrace() {
  try {
    finish();
  } catch (...) {  // a destructor during unwinding must not throw
  }
}

void TorchTrace::step_finished(int64_t step) {
  if (on_ && step == first_ + count_ - 1) return finish();
  if (path_.empty() || on_ || step != first_ - 1) return;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (at::hasCUDA()) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  on_ = true;
}

void TorchTrace::finish() {
  if (!on_) return;
  on_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  // Written beside and renamed: no half-written trace is left where the path points.
  const std::string partial = path_ + ".partial";
  result->save(partial);
  std::error_code error;
  std::filesystem::rename(partial, path_, error);
  if (error) throw Error("--torch-trace: cannot write " + path_ + ": " + error.message());
  std::printf("torch trace of steps %lld-%lld written to %s\n", static_cast<long long>(first_),
              static_cast<long long>(first_ + count_ - 1), path_.c_str());
}

}  // namespace dawnpiper
