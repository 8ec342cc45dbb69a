// A CPU tensor over the same host memory as an HPU tensor of the stand-in plugin (no copy),
// shared by the plugin (copies, fill_, the CPU fallback) and the hccl backend (gloo reads and
// writes the HPU memory through it). It keeps the HPU storage alive. Non-HPU (or undefined)
// tensors are returned as they are.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/UniqueVoidPtr.h>

namespace trainbook_standin {

inline at::Tensor host_view(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::HPU) {
    return t;
  }
  c10::Storage storage = t.storage();
  void* base = storage.mutable_data();
  at::DataPtr data = c10::InefficientStdFunctionContext::makeDataPtr(
      base, [storage](void*) {}, c10::Device(c10::DeviceType::CPU));
  c10::Storage cpu_storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                           /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(cpu_storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return out;
}

}  // namespace trainbook_standin
