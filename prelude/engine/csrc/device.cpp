// Tensor placement on devices tch cannot name. tch's `Device` has CPU, CUDA, MPS and Vulkan
// only, and reports any other device (an Intel Gaudi HPU among them) as MPS; asking tch to put
// a tensor on that device would put it on MPS. These helpers take PyTorch's own device numbering
// (c10::DeviceType) or "the device of that tensor", so the engine can place models and batches on
// any device a libtorch plugin registers. Errors come back as strings, never as exceptions.

#include "errors.h"
#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

namespace {
using trainbook::set_err;
using trainbook::trim_what;


template <typename F>
at::Tensor* guarded(char* err, size_t len, F&& f) {
  try {
    return new at::Tensor(f());
  } catch (const std::exception& e) {
    set_err(err, len, trim_what(e.what()));
  } catch (...) {
    set_err(err, len, "unknown C++ exception while placing a tensor");
  }
  return nullptr;
}
}  // namespace

extern "C" {

// `t` copied to device (type, index); c10::DeviceType numbering (0 CPU, 1 CUDA, 15 HPU).
at::Tensor* tb_to_device(const at::Tensor* t, int type, int index, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    return t->to(c10::Device(static_cast<c10::DeviceType>(type),
                             static_cast<c10::DeviceIndex>(index)));
  });
}

// `t` on the device of `like` (what a model's forward pass needs for tensors it creates).
at::Tensor* tb_to_device_of(const at::Tensor* t, const at::Tensor* like, char* err,
                            size_t errlen) {
  return guarded(err, errlen, [&] { return t->to(like->device()); });
}

// The device of `t` in c10 numbering (tch only knows the ones it has names for).
void tb_device_of(const at::Tensor* t, int* type, int* index) {
  auto d = t->device();
  *type = static_cast<int>(d.type());
  *index = d.has_index() ? d.index() : -1;
}
}
