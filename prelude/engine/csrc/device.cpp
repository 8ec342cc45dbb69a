// Tensor placement on devices tch cannot name. tch's `Device` has CPU, CUDA, MPS and Vulkan
// only, and reports any other device (an Intel Gaudi HPU among them) as MPS; asking tch to put
// a tensor on that device would put it on MPS. These helpers take PyTorch's own device numbering
// (c10::DeviceType) or "the device of that tensor", so the engine can place models and batches on
// any device a libtorch plugin registers. Errors come back as strings, never as exceptions.

#include "errors.h"
#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/GradMode.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#ifdef TRAINBOOK_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

namespace {
using trainbook::set_err;
using trainbook::trim_what;


template <typename F>
at::Tensor* new_tensor_or_error(char* err, size_t len, F&& f) {
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
  return new_tensor_or_error(err, errlen, [&] {
    return t->to(c10::Device(static_cast<c10::DeviceType>(type),
                             static_cast<c10::DeviceIndex>(index)));
  });
}

// `t` on the device of `like` (what a model's forward pass needs for tensors it creates).
at::Tensor* tb_to_device_of(const at::Tensor* t, const at::Tensor* like, char* err,
                            size_t errlen) {
  return new_tensor_or_error(err, errlen, [&] { return t->to(like->device()); });
}

// `t` with its memory in channels-last order (NHWC) when `channels_last`, else in the usual
// contiguous order; the logical shape stays NCHW. tch has no memory formats.
at::Tensor* tb_contiguous_as(const at::Tensor* t, int channels_last, char* err, size_t errlen) {
  return new_tensor_or_error(err, errlen, [&] {
    return t->contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                       : at::MemoryFormat::Contiguous);
  });
}

// A parameter's storage swapped for a channels-last copy, in place: the same variable (the
// optimizer's references stay valid), as `model.to(memory_format=torch.channels_last)` does.
int tb_channels_last_(at::Tensor* t, char* err, size_t errlen) {
  try {
    if (t->dim() == 4) {
      c10::AutoGradMode no_grad(false);
      t->set_data(t->contiguous(at::MemoryFormat::ChannelsLast));
    }
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
}

// Whether `t` is laid out channels-last.
int tb_is_channels_last(const at::Tensor* t) {
  return t->dim() == 4 && t->is_contiguous(at::MemoryFormat::ChannelsLast) ? 1 : 0;
}

// The device of `t` in c10 numbering (tch only knows the ones it has names for).
void tb_device_of(const at::Tensor* t, int* type, int* index) {
  auto d = t->device();
  *type = static_cast<int>(d.type());
  *index = d.has_index() ? d.index() : -1;
}

// An event recorded now on the current stream of CUDA device `index`: it completes when the
// work queued before it has run, so the host can wait for that point alone while later work
// stays queued. Through c10's device-generic events (libc10_cuda registers CUDA's at load
// time): no CUDA runtime symbol of trainbook's own. Null with a message on error (no CUDA).
void* tb_cuda_event_record(int index, char* err, size_t errlen) {
  try {
    c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    auto* e = new c10::Event(c10::DeviceType::CUDA);
    try {
      e->record(impl.getStream(device));
    } catch (...) {
      delete e;
      throw;
    }
    return e;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return nullptr;
}

// Waits until event `e` (from tb_cuda_event_record) has completed. 0, or -1 with a message.
int tb_cuda_event_wait(void* e, char* err, size_t errlen) {
  try {
    static_cast<c10::Event*>(e)->synchronize();
    return 0;
  } catch (const std::exception& ex) {
    set_err(err, errlen, trim_what(ex.what()));
  }
  return -1;
}

void tb_cuda_event_free(void* e) { delete static_cast<c10::Event*>(e); }

// torch.cuda.set_sync_debug_mode(level): 0 off, 1 warn, 2 error at every operation that makes
// the host wait for the GPU. 0, or -1 with a message (a build without CUDA).
int tb_cuda_sync_debug(int level, char* err, size_t errlen) {
#ifdef TRAINBOOK_WITH_NCCL
  try {
    c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(level));
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
#else
  (void)level;
  set_err(err, errlen, "this trainbook was built without CUDA");
  return -1;
#endif
}
}
