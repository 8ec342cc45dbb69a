// The step profiler: libtorch's own (Kineto), driven as torch.profiler drives it, so the trace
// it saves is the Chrome trace PyTorch users know (Perfetto, chrome://tracing, TensorBoard's
// PyTorch profiler plugin). tch exposes none of it.

#include "errors.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <exception>
#include <set>
#include <string>

using trainbook::set_err;
using trainbook::trim_what;

namespace {

// A named range in the trace (a step: torch.profiler's "ProfilerStep#N"). The name is owned
// here: RecordFunction keeps a view of it until the range ends.
struct Range {
  std::string name;
  at::RecordFunction rf;
  explicit Range(std::string n) : name(std::move(n)), rf(at::RecordScope::USER_SCOPE) {
    if (rf.isActive()) rf.before(std::string_view(name));
  }
};

}  // namespace

extern "C" {

// Starts recording CPU operators (with their input shapes) and, when `with_cuda`, CUDA kernels
// and runtime calls, on this thread and the autograd threads it starts.
int tb_profiler_start(int with_cuda, char* err, size_t errlen) {
  try {
    using namespace torch::profiler::impl;
    ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
    std::set<ActivityType> activities{ActivityType::CPU};
    if (with_cuda) activities.insert(ActivityType::CUDA);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
}

// Stops recording and writes the Chrome trace to `path` (null: discards it).
int tb_profiler_stop(const char* path, char* err, size_t errlen) {
  try {
    auto result = torch::autograd::profiler::disableProfiler();
    if (path != nullptr && result) result->save(path);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
}

void* tb_range_begin(const char* name) {
  try {
    return new Range(name);
  } catch (...) {
    return nullptr;
  }
}

void tb_range_end(void* range) {
  try {
    delete static_cast<Range*>(range);
  } catch (...) {
  }
}
}
