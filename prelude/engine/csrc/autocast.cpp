// Mixed-precision autocast for any device type. tch's `autocast` only switches CUDA on and
// leaves its dtype at float16; trainbook wants bfloat16 (no loss scaling needed) on CUDA, and
// the same on CPU so the code path runs on every machine.

#include "errors.h"
#include <ATen/autocast_mode.h>

#include <cstring>
#include <exception>
#include <string>

using trainbook::set_err;

extern "C" {

// Enables autocast to bfloat16 on `device_type` (c10::DeviceType as int: 0 CPU, 1 CUDA, 15 HPU).
int tb_autocast_enter(int device_type, char* err, size_t errlen) {
  try {
    auto dt = static_cast<c10::DeviceType>(device_type);
    at::autocast::set_autocast_dtype(dt, at::kBFloat16);
    at::autocast::set_autocast_enabled(dt, true);
    at::autocast::increment_nesting();
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, e.what());
  }
  return -1;
}

void tb_autocast_exit(int device_type) {
  try {
    auto dt = static_cast<c10::DeviceType>(device_type);
    at::autocast::set_autocast_enabled(dt, false);
    // The cast-weight cache lives for one autocast region, as in torch.autocast.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  } catch (...) {
  }
}
}
