// PyTorch's fused optimizer kernels (`_fused_adamw_`, `_fused_sgd_`: one vectorised,
// multi-threaded pass over each parameter instead of a chain of elementwise ops), which tch does
// not expose; and on Intel Gaudi the bridge's own fused ops (`hpu::optimizer_adamw`,
// `hpu::optimizer_sgd`, `hpu::optimizer_sgd_momentum`), since it has no kernel for PyTorch's
// (they would run on the host every step). Tensors arrive as tch's `at::Tensor*`; errors come
// back as strings.

#include "errors.h"
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>
#include <string>

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

// An operator the Gaudi bridge registers with the dispatcher, or a c10::Error naming it.
c10::OperatorHandle bridge_op(const char* name) {
  auto op = c10::Dispatcher::singleton().findSchema({name, ""});
  TORCH_CHECK(op.has_value(), name,
              " is not registered: the Gaudi bridge loaded without its fused optimizer ops (eager "
              "mode, PT_HPU_LAZY_MODE=0, registers them; bridge 1.19 does)");
  return *op;
}

// A one-element tensor of `value` with the dtype and device of `like` (as Habana's optimizers
// pass their step sizes: a tensor, so a new value needs no new compiled graph).
at::Tensor scalar_like(double value, const at::Tensor& like) {
  return at::tensor({value}, at::kFloat).to(like.dtype()).to(like.device());
}

// AdamW through hpu::optimizer_adamw, with the arguments Habana's FusedAdamW passes in eager
// mode: the bias corrections folded into the (negative) step size, decoupled weight decay as a
// factor (1 - lr * wd) on the weights. The op adds eps to the uncorrected sqrt(v), so this is
// torch's AdamW with eps scaled by sqrt(1 - beta2^step) (the paper's epsilon-hat form).
void hpu_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
             void* const* exp_avg_sqs, size_t n, int64_t step, double lr, double beta1,
             double beta2, double weight_decay, double eps) {
  static const c10::OperatorHandle op = bridge_op("hpu::optimizer_adamw");
  auto w = list(params, n);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  const double decay = 1.0 - weight_decay * lr;
  torch::jit::Stack stack{c10::IValue(list(grads, n)), c10::IValue(w),
                          c10::IValue(list(exp_avgs, n)), c10::IValue(list(exp_avg_sqs, n)),
                          scalar_like(-lr * std::sqrt(bc2) / bc1, w[0]), beta1, beta2, eps,
                          scalar_like(decay, w[0]), decay != 1.0, c10::IValue(), c10::IValue()};
  op.callBoxed(&stack);
}

// SGD through hpu::optimizer_sgd (no momentum) or hpu::optimizer_sgd_momentum, as Habana's
// FusedSGD calls them: the learning rate and momentum as float32 tensors, coupled weight decay,
// no dampening, buffers that start at zero and the op's step input left at 0 (with dampening 0
// its first update equals torch.optim.SGD's).
void hpu_sgd(void* const* params, void* const* grads, void* const* momentum_buffers, size_t n,
           double lr, double momentum, double weight_decay) {
  auto w = list(params, n);
  const auto device = w[0].device();
  const at::Tensor lr_t = at::tensor({lr}, at::kFloat).to(device);
  torch::jit::Stack stack;
  if (momentum == 0.0) {
    static const c10::OperatorHandle op = bridge_op("hpu::optimizer_sgd");
    stack = {c10::IValue(list(grads, n)), c10::IValue(w), lr_t, weight_decay, 0.0, 0.0, false};
    op.callBoxed(&stack);
  } else {
    static const c10::OperatorHandle op = bridge_op("hpu::optimizer_sgd_momentum");
    const at::Tensor step_t = at::zeros({1}, at::kInt).to(device);
    const at::Tensor mom_t = at::scalar_tensor(momentum, at::kFloat).to(device);
    stack = {c10::IValue(list(grads, n)), c10::IValue(w), c10::IValue(list(momentum_buffers, n)),
             step_t, lr_t, mom_t, weight_decay, 0.0, false};
    op.callBoxed(&stack);
  }
}
}  // namespace

extern "C" {

// AdamW over n parameters; `steps` are float scalar tensors holding the step number already
// incremented for this update (as torch.optim.AdamW(fused=True) passes them), `step` the same
// number. Parameters on an HPU go through the Gaudi bridge's op instead (see hpu_adamw).
// `lr_t`, when not null, is the learning rate as a device scalar (what a CUDA graph replays:
// its value changes between replays, a host number would be baked in).
int tb_fused_adamw(void* const* params, void* const* grads, void* const* exp_avgs,
                   void* const* exp_avg_sqs, void* const* steps, size_t n, int64_t step,
                   double lr, const at::Tensor* lr_t, double beta1, double beta2,
                   double weight_decay, double eps, char* err, size_t errlen) {
  try {
    c10::AutoGradMode no_grad(false);  // parameters are leaves that require grad
    if (n > 0 && static_cast<at::Tensor*>(params[0])->device().type() == c10::DeviceType::HPU) {
      hpu_adamw(params, grads, exp_avgs, exp_avg_sqs, n, step, lr, beta1, beta2, weight_decay, eps);
      return 0;
    }
    if (lr_t != nullptr) {
      at::_fused_adamw_(list(params, n), list(grads, n), list(exp_avgs, n),
                        list(exp_avg_sqs, n), {}, list(steps, n), *lr_t, beta1, beta2,
                        weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false);
      return 0;
    }
    at::_fused_adamw_(list(params, n), list(grads, n), list(exp_avgs, n), list(exp_avg_sqs, n),
                      {}, list(steps, n), lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
}

int tb_fused_sgd(void* const* params, void* const* grads, void* const* momentum_buffers, size_t n,
                 double lr, const at::Tensor* lr_t, double momentum, double weight_decay,
                 int is_first_step, char* err, size_t errlen) {
  try {
    c10::AutoGradMode no_grad(false);  // parameters are leaves that require grad
    if (n > 0 && static_cast<at::Tensor*>(params[0])->device().type() == c10::DeviceType::HPU) {
      hpu_sgd(params, grads, momentum_buffers, n, lr, momentum, weight_decay);
      return 0;
    }
    std::vector<at::Tensor> bufs;
    if (momentum != 0.0) bufs = list(momentum_buffers, n);
    if (lr_t != nullptr) {
      at::_fused_sgd_(list(params, n), list(grads, n), bufs, weight_decay, momentum, *lr_t,
                      /*dampening=*/0.0, /*nesterov=*/false, /*maximize=*/false,
                      is_first_step != 0);
      return 0;
    }
    at::_fused_sgd_(list(params, n), list(grads, n), bufs, weight_decay, momentum, lr,
                    /*dampening=*/0.0, /*nesterov=*/false, /*maximize=*/false,
                    is_first_step != 0);
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
}

// Drops each parameter's gradient (PyTorch's `zero_grad(set_to_none=True)`, its default): the
// next backward pass hands its gradient over instead of adding it to zeros, so a step does no
// fill and no add per parameter.
void tb_grads_to_none(void* const* params, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    try {
      static_cast<at::Tensor*>(params[i])->mutable_grad().reset();
    } catch (...) {
    }
  }
}

}
