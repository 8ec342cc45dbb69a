// Activation checkpointing: an autograd node that keeps a function's inputs instead of the
// activations it would save, and in the backward pass runs the function again with gradients
// enabled and back-propagates through that second forward. tch exposes no custom autograd
// function, so the node lives here and calls back into Rust for the forward (a function pointer
// and an opaque context, released when the node is).
//
// What the second forward must see to repeat the first one exactly is saved with the inputs: the
// random generators' states (dropout masks) and the autocast flags of the forward, since the
// backward pass runs outside the autocast region that produced the node.

#include "errors.h"
#include "torch_compat.h"
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {
using torch::autograd::variable_list;

// Runs the function on `inputs` (tensors handed over as new at::Tensor*, which Rust takes
// ownership of); writes a new at::Tensor* for the output, or a message and returns nonzero.
using ForwardFn = int (*)(void* ctx, void** inputs, size_t n, void** out, char* err,
                          size_t errlen);
using DropFn = void (*)(void* ctx);

struct Closure {
  ForwardFn forward = nullptr;
  void* ctx = nullptr;
  DropFn drop = nullptr;
  Closure() = default;
  Closure(const Closure&) = delete;
  Closure& operator=(const Closure&) = delete;
  ~Closure() {
    if (drop != nullptr) drop(ctx);
  }
  at::Tensor operator()(const std::vector<at::Tensor>& inputs) const {
    std::vector<void*> raw;
    raw.reserve(inputs.size());
    for (const auto& t : inputs) raw.push_back(new at::Tensor(t));
    void* out = nullptr;
    char err[1024] = {0};
    int rc = forward(ctx, raw.data(), raw.size(), &out, err, sizeof err);
    TORCH_CHECK(rc == 0 && out != nullptr, "the checkpointed function failed: ", err);
    auto* p = static_cast<at::Tensor*>(out);
    at::Tensor r = std::move(*p);
    delete p;
    return r;
  }
};

// The default generator of a device type, when it has one this build can reach (CPU always;
// CUDA or a plugin device through its hooks).
std::optional<at::Generator> generator_of(const at::Device& device) {
  try {
    if (device.is_cpu()) return at::detail::getDefaultCPUGenerator();
    return at::globalContext().defaultGenerator(device);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

struct RngState {
  at::Generator gen;
  at::Tensor state;
};

std::vector<RngState> save_rng(const at::Device& device) {
  std::vector<RngState> saved;
  std::vector<at::Device> devices{at::Device(at::kCPU)};
  if (!device.is_cpu()) devices.push_back(device);
  for (const auto& d : devices) {
    auto g = generator_of(d);
    if (!g) continue;
    std::lock_guard<std::mutex> lock(g->mutex());
    saved.push_back({*g, g->get_state()});
  }
  return saved;
}

void restore_rng(std::vector<RngState> states) {
  for (auto& s : states) {
    std::lock_guard<std::mutex> lock(s.gen.mutex());
    s.gen.set_state(s.state);
  }
}

struct AutocastState {
  c10::DeviceType type;
  bool enabled;
  at::ScalarType dtype;
};

std::vector<AutocastState> autocast_state(const at::Device& device) {
  std::vector<c10::DeviceType> types{at::kCPU};
  if (device.type() != at::kCPU) types.push_back(device.type());
  std::vector<AutocastState> v;
  for (auto t : types) {
    try {
      v.push_back({t, at::autocast::is_autocast_enabled(t), at::autocast::get_autocast_dtype(t)});
    } catch (const std::exception&) {
    }
  }
  return v;
}

// Puts the forward's autocast flags in place for the recomputation and takes them back after,
// as torch.autocast's enter and exit do (the cast-weight cache lives for one region).
class AutocastAs {
 public:
  explicit AutocastAs(const std::vector<AutocastState>& want) {
    for (const auto& w : want) {
      before_.push_back({w.type, at::autocast::is_autocast_enabled(w.type),
                         at::autocast::get_autocast_dtype(w.type)});
      at::autocast::set_autocast_dtype(w.type, w.dtype);
      at::autocast::set_autocast_enabled(w.type, w.enabled);
    }
    at::autocast::increment_nesting();
  }
  ~AutocastAs() {
    for (const auto& b : before_) {
      at::autocast::set_autocast_dtype(b.type, b.dtype);
      at::autocast::set_autocast_enabled(b.type, b.enabled);
    }
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }

 private:
  std::vector<AutocastState> before_;
};

struct RecomputeBackward : public torch::autograd::Node {
  std::shared_ptr<Closure> fn;
  // The inputs, detached (the node's edges carry the graph), and which of them need gradients.
  std::vector<at::Tensor> inputs;
  std::vector<bool> needs_grad;
  std::vector<RngState> rng;
  std::vector<AutocastState> autocast;

  std::string name() const override { return "trainbook::RecomputeBackward"; }

  variable_list apply(variable_list&& grads) override {
    std::vector<at::Tensor> leaves;
    leaves.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      leaves.push_back(inputs[i].detach().requires_grad_(needs_grad[i]));
    }
    // Replay the forward with its random state, then give the generators back the state they
    // have now, so checkpointing does not change what later draws see.
    auto now = save_rng(inputs.empty() ? at::Device(at::kCPU) : inputs[0].device());
    at::Tensor out;
    {
      restore_rng(rng);
      AutocastAs as(autocast);
      at::AutoGradMode enable(true);
      out = (*fn)(leaves);
    }
    restore_rng(now);
    if (out.requires_grad() && grads[0].defined()) {
      torch::autograd::backward({out}, {grads[0]});
    }
    variable_list result;
    result.reserve(leaves.size());
    for (size_t i = 0; i < leaves.size(); ++i) {
      result.push_back(needs_grad[i] ? leaves[i].grad() : at::Tensor());
    }
    return result;
  }

  void release_variables() override {
    inputs.clear();
    rng.clear();
  }
};
}  // namespace

extern "C" {

// out = fn(inputs), recorded as one autograd node that recomputes fn in the backward pass.
// Without gradient mode, or when no input needs a gradient, fn simply runs (and records what it
// records): a checkpoint whose inputs need no gradient would give its parameters none.
int tb_checkpointed(void* const* inputs, size_t n, ForwardFn forward, void* ctx, DropFn drop,
                    void** out, char* err, size_t errlen) {
  // Built in place: a temporary Closure would release the context in its destructor.
  auto closure = std::make_shared<Closure>();
  closure->forward = forward;
  closure->ctx = ctx;
  closure->drop = drop;
  return trainbook::report_errors(err, errlen, [&] {
    std::vector<at::Tensor> ins;
    ins.reserve(n);
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      ins.push_back(*static_cast<at::Tensor*>(inputs[i]));
      any = any || ins.back().requires_grad();
    }
    if (!c10::GradMode::is_enabled() || !any) {
      *out = new at::Tensor((*closure)(ins));
      return 0;
    }
    auto device = ins[0].device();
    auto node = trainbook::make_autograd_node<RecomputeBackward>();
    node->rng = save_rng(device);
    node->autocast = autocast_state(device);
    at::Tensor result;
    {
      at::NoGradGuard no_grad;
      result = (*closure)(ins);
    }
    node->fn = closure;
    node->set_next_edges(torch::autograd::collect_next_edges(ins));
    for (const auto& t : ins) {
      node->inputs.push_back(t.detach());
      node->needs_grad.push_back(t.requires_grad());
    }
    // The output is a fresh tensor made without gradient mode: the node becomes its history.
    torch::autograd::set_history(result, node);
    *out = new at::Tensor(std::move(result));
    return 0;
  });
}
}
