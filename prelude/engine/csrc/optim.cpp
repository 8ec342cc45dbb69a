// PyTorch's fused optimizer kernels (`_fused_adamw_`, `_fused_sgd_`: one vectorised,
// multi-threaded pass over each parameter instead of a chain of elementwise ops), which tch does
// not expose. Tensors arrive as tch's `at::Tensor*`; errors come back as strings.

#include "errors.h"
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>

#include <cstring>
#include <exception>
#include <vector>

namespace {
using trainbook::set_err;
using trainbook::trim_what;

std::vector<at::Tensor> list(void* const* ts, size_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(*static_cast<at::Tensor*>(ts[i]));
  return v;
}
}  // namespace

extern "C" {

// AdamW over n parameters; `steps` are float scalar tensors holding the step number already
// incremented for this update (as torch.optim.AdamW(fused=True) passes them).
int tb_fused_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                   void* const* exp_avg_sqs, void* const* steps, size_t n, double lr,
                   double beta1, double beta2, double weight_decay, double eps, char* err,
                   size_t errlen) {
  try {
    c10::AutoGradMode no_grad(false);  // parameters are leaves that require grad
    at::_fused_adamw_(list(params, n), list(grads, n), list(exp_avgs, n), list(exp_avg_sqs, n),
                      {}, list(steps, n), lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, e.what());
  }
  return -1;
}

int tb_fused_sgd(void* const* params, void* const* grads, void* const* momentum_buffers, size_t n,
                 double lr, double momentum, double weight_decay, int is_first_step, char* err,
                 size_t errlen) {
  try {
    c10::AutoGradMode no_grad(false);  // parameters are leaves that require grad
    std::vector<at::Tensor> bufs;
    if (momentum != 0.0) bufs = list(momentum_buffers, n);
    at::_fused_sgd_(list(params, n), list(grads, n), bufs, weight_decay, momentum, lr,
                    /*dampening=*/0.0, /*nesterov=*/false, /*maximize=*/false,
                    is_first_step != 0);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, e.what());
  }
  return -1;
}
}
