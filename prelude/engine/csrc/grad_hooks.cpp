// A hook that runs when a parameter's gradient has been accumulated in the backward pass, then
// drops that gradient: ZeRO stage 2 copies each gradient into a communication bucket as soon as
// autograd produces it and reduce-scatters full buckets while the backward pass goes on, so no
// rank ever holds the whole model's gradients. torch's post-accumulate-grad hook is the point
// where a leaf's gradient is complete (summed over every use, such as tied weights); tch does
// not expose it, so it lives here and calls back into Rust with the parameter's index.

#include "errors.h"
#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <memory>

namespace {

using GradFn = void (*)(void* ctx, size_t index);

struct TakeGrad : public torch::autograd::PostAccumulateGradHook {
  GradFn fn;
  void* ctx;
  size_t index;
  TakeGrad(GradFn f, void* c, size_t i) : fn(f), ctx(c), index(i) {}
  void operator()(const torch::autograd::Variable& param) override {
    fn(ctx, index);
    // The gradient now lives in the bucket: free the parameter-sized tensor.
    param.mutable_grad().reset();
  }
};
}  // namespace

extern "C" {

// Calls fn(ctx, index) each time `param`'s gradient is accumulated, then drops the gradient.
// Replaces any hook of this kind the parameter had.
int tb_take_grad_hook(void* param, GradFn fn, void* ctx, size_t index, char* err, size_t errlen) {
  return trainbook::report_errors(err, errlen, [&] {
    const auto& t = *static_cast<at::Tensor*>(param);
    TORCH_CHECK(t.is_leaf() && t.requires_grad(),
                "a gradient hook needs a trainable parameter (a leaf that requires grad)");
    torch::autograd::impl::set_post_acc_grad_hooks(t, std::make_unique<TakeGrad>(fn, ctx, index));
    return 0;
  });
}

void tb_clear_grad_hook(void* param) {
  try {
    torch::autograd::impl::set_post_acc_grad_hooks(*static_cast<at::Tensor*>(param), nullptr);
  } catch (...) {
  }
}
}
