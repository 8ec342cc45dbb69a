// ZeRO-3's storage tricks, which tch does not expose: a unit's parameters are views of one flat
// buffer whose storage is freed after the unit's forward and allocated again (then all-gathered
// into) for its backward. Resizing the storage, not swapping tensors, is what keeps autograd
// content: the tensors the forward saved for the backward share that storage and see the
// gathered values again, and no version counter moves. A hook on a tensor's gradient tells Rust
// when the backward pass reaches a unit's output (gather it) and leaves its input (free it).

#include "errors.h"
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <vector>

namespace {
using UnitHookFn = void (*)(void* ctx, size_t tag);
}  // namespace

extern "C" {

// Gives `tensor`'s storage `nbytes` bytes on its own device (0 frees it), keeping the storage
// object, so every view of it and every tensor autograd saved from it stays attached.
int tb_resize_storage(void* tensor, size_t nbytes, char* err, size_t errlen) {
  return trainbook::report_errors(err, errlen, [&] {
    const auto& t = *static_cast<at::Tensor*>(tensor);
    c10::Storage storage = t.storage();
    auto device = t.device();
    if (nbytes == 0) {
      storage.set_data_ptr_noswap(c10::DataPtr(nullptr, device));
      storage.set_nbytes(0);
      return 0;
    }
    if (storage.nbytes() == nbytes) return 0;
    // A fresh allocation from the device's own allocator, whose data pointer (and deleter)
    // the storage takes over.
    at::Tensor fresh = at::empty({static_cast<int64_t>(nbytes)},
                                 at::TensorOptions().dtype(at::kByte).device(device));
    c10::DataPtr data = fresh.storage().set_data_ptr(c10::DataPtr(nullptr, device));
    fresh.storage().set_nbytes(0);
    storage.set_data_ptr_noswap(std::move(data));
    storage.set_nbytes(nbytes);
    return 0;
  });
}

// Points `param` (a leaf) at `numel(param)` elements of `flat`'s storage from element `offset`
// of `flat` on, contiguous, keeping it a leaf that requires a gradient if it did. A buffer of
// another dtype (bf16 copies of fp32 parameters) gives the parameter its dtype: its data is
// replaced first (`set_data`, which keeps its hooks and its autograd identity); so is one on
// another device.
int tb_view_into(void* param, void* flat, int64_t offset, char* err, size_t errlen) {
  return trainbook::report_errors(err, errlen, [&] {
    auto& p = *static_cast<at::Tensor*>(param);
    const auto& f = *static_cast<at::Tensor*>(flat);
    TORCH_CHECK(offset + p.numel() <= f.numel(), "a parameter's place lies outside its unit's buffer");
    auto sizes = p.sizes().vec();
    if (p.scalar_type() != f.scalar_type() || p.device() != f.device()) {
      p.set_data(at::empty({0}, f.options()));
    }
    at::NoGradGuard no_grad;
    std::vector<int64_t> strides(sizes.size(), 1);
    for (size_t d = sizes.size(); d > 1; --d) strides[d - 2] = strides[d - 1] * sizes[d - 1];
    p.set_(f.storage(), f.storage_offset() + offset, sizes, strides);
    return 0;
  });
}

// Gives `param` (a leaf) `like`'s dtype and device and no storage, keeping its sizes: a
// variable of a model built under ZeRO-3 whose values live in this rank's slice until its unit
// is captured (which points it into the unit's buffer). `at::empty` reserves without writing,
// so no page of the whole tensor is touched.
int tb_hollow(void* param, void* like, char* err, size_t errlen) {
  return trainbook::report_errors(err, errlen, [&] {
    auto& p = *static_cast<at::Tensor*>(param);
    const auto& l = *static_cast<at::Tensor*>(like);
    p.set_data(at::empty(p.sizes(), l.options()));
    c10::Storage storage = p.storage();
    storage.set_data_ptr_noswap(c10::DataPtr(nullptr, l.device()));
    storage.set_nbytes(0);
    return 0;
  });
}

// Calls fn(ctx, tag) when the gradient with respect to `tensor` has been computed in the
// backward pass (before the nodes that consume it run); the gradient passes unchanged.
int tb_unit_hook(void* tensor, UnitHookFn fn, void* ctx, size_t tag, char* err, size_t errlen) {
  return trainbook::report_errors(err, errlen, [&] {
    auto& t = *static_cast<at::Tensor*>(tensor);
    TORCH_CHECK(t.requires_grad(), "a unit hook needs a tensor that requires a gradient");
    t.register_hook([fn, ctx, tag](const at::Tensor&) { fn(ctx, tag); });
    return 0;
  });
}
}
