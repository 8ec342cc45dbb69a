// Test stand-in for the eager-mode plugin of Intel Gaudi's PyTorch bridge
// (libhabana_pytorch2_plugin.so). Like the real plugin it registers PyTorch's built-in
// c10::DeviceType::HPU from static initialisers when loaded with RTLD_GLOBAL:
//   - an allocator for HPU (host memory; DataPtr device hpu:0),
//   - a DeviceGuardImplInterface for HPU (one device),
//   - HPU hooks (so torch.accelerator / barrier() see an HPU),
//   - aten kernels for the HPU key: factories, copies, views, resize/set, fill/zero, item,
//     convolution (forward and backward),
//     plus a boxed CPU fallback for every other operator,
//   - AutocastHPU kernels with the bridge's own bf16/fp32 op lists, so torch.autocast("hpu") works
//     as on a Gaudi,
//   - on a CUDA-enabled torch wheel: do-nothing CUDA hooks, so that HPU is the accelerator (see
//     NoCUDAHooks; needs the plugin loaded before `import torch`).
// "Device memory" is ordinary host memory, so HPU tensors can be viewed as CPU tensors without
// copying (host_view below); that is how copies, fill_ and the CPU fallback reach the data.
//
// Device acquisition (the first allocation) fails like the real bridge when
// TRAINBOOK_STANDIN_HPU_BUSY=1 ("no free module"), or when PT_HPU_LAZY_MODE asks for the lazy
// plugin, which this stand-in does not have.
// Used only by tests: see tests/hpu/README.md.

#include "host_view.h"
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/HPUHooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <unordered_set>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace trainbook_standin {

constexpr c10::DeviceType kHPU = c10::DeviceType::HPU;
const c10::Device kDevice(kHPU, 0);

std::atomic<bool> g_acquired{false};

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// The real bridge acquires a Gaudi module on first use. Here: succeed unless told otherwise.
void acquire_device() {
  if (g_acquired.load(std::memory_order_acquire)) {
    return;
  }
  const char* lazy = std::getenv("PT_HPU_LAZY_MODE");
  TORCH_CHECK(
      lazy == nullptr || std::strcmp(lazy, "0") == 0,
      "Wrong PT plugin library loaded: the eager plugin (libhabana_pytorch2_plugin.so) is loaded "
      "but PT_HPU_LAZY_MODE=", lazy, " (trainbook HPU stand-in: eager mode only)");
  // Real message, raised by synDeviceAcquire* when every module is held by another process.
  TORCH_CHECK(
      !env_is("TRAINBOOK_STANDIN_HPU_BUSY", "1"),
      "synStatus=20 [Device already acquired] Device acquire failed.");
  g_acquired.store(true, std::memory_order_release);
}

// Exit, as the bridge does it (backend/habana_device/hpu_cached_devices.cpp, v1.19): when Python
// is initialised it registers its cleanup on Python's atexit (here habana_frameworks.torch's
// __init__ registers tb_standin_exit_cleanup); a process that never runs Python's exit handlers
// (one that embeds Python and does not finalise it) gets the static-destructor fallback instead,
// whose process-group cleanup imports torch.distributed without taking the GIL. The real one then
// crashes somewhere inside Python; the stand-in aborts there, with a message, every time.
//
// TRAINBOOK_STANDIN_HANG_AT_EXIT=<rank> makes that rank's exit hang after its work is done, as a
// rank does in the bridge's teardown barrier when a peer never arrives, so the driver's bound on
// teardown can be tested.
std::atomic<bool> g_exit_cleanup_ran{false};

// Calls of the bridge's fused optimizer ops, printed at the exit cleanup when
// TRAINBOOK_STANDIN_OP_COUNTS=1 (so tests can see which path a worker took).
std::atomic<long> g_adamw_calls{0}, g_sgd_calls{0}, g_sgd_momentum_calls{0};

void print_op_counts() {
  if (!env_is("TRAINBOOK_STANDIN_OP_COUNTS", "1")) return;
  std::fprintf(stderr,
               "habana (trainbook stand-in): op calls: hpu::optimizer_adamw=%ld "
               "hpu::optimizer_sgd=%ld hpu::optimizer_sgd_momentum=%ld\n",
               g_adamw_calls.load(), g_sgd_calls.load(), g_sgd_momentum_calls.load());
  std::fflush(stderr);
}

struct ExitTeardown {
  ~ExitTeardown() {
    const char* rank = std::getenv("RANK");
    const char* which = std::getenv("TRAINBOOK_STANDIN_HANG_AT_EXIT");
    if (g_acquired.load() && rank != nullptr && which != nullptr && std::strcmp(rank, which) == 0) {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
      }
    }
    if (!g_acquired.load() || g_exit_cleanup_ran.load()) {
      return;
    }
    using Probe = int (*)();
    auto initialized = reinterpret_cast<Probe>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
    auto holds_gil = reinterpret_cast<Probe>(dlsym(RTLD_DEFAULT, "PyGILState_Check"));
    if (initialized != nullptr && holds_gil != nullptr && initialized() != 0 && holds_gil() == 0) {
      std::fprintf(stderr,
                   "habana (trainbook stand-in): process exit without Python's exit handlers: the "
                   "bridge's static cleanup imports torch.distributed without the GIL here "
                   "(~HPURegistrar -> ProcessGroupHCCLRegistry::cleanup); aborting as the real "
                   "bridge would crash\n");
      std::fflush(stderr);
      std::abort();
    }
  }
};
ExitTeardown g_exit_teardown;

}  // namespace trainbook_standin

// The cleanup habana_frameworks.torch registers on Python's atexit.
extern "C" __attribute__((visibility("default"))) void tb_standin_exit_cleanup() {
  trainbook_standin::print_op_counts();
  trainbook_standin::g_exit_cleanup_ran.store(true);
}

namespace trainbook_standin {

// ---------------------------------------------------------------------------------------------
// Allocator: host memory that reports device hpu:0.

void hpu_free(void* ptr) {
  c10::free_cpu(ptr);
}

struct HostBackedHPUAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    acquire_device();
    void* data = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
    return {data, data, &hpu_free, kDevice};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &hpu_free;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

HostBackedHPUAllocator g_allocator;
REGISTER_ALLOCATOR(c10::DeviceType::HPU, &g_allocator);

// ---------------------------------------------------------------------------------------------
// Device guard: a single device, synchronous "streams", no-op events.

struct HPUGuardImpl final : c10::impl::DeviceGuardImplInterface {
  HPUGuardImpl() = default;
  explicit HPUGuardImpl(c10::DeviceType t) {
    TORCH_INTERNAL_ASSERT(t == kHPU);
  }
  c10::DeviceType type() const override {
    return kHPU;
  }
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == kHPU, "expected an hpu device, got ", d);
    TORCH_CHECK(d.index() <= 0, "Invalid device id ", static_cast<int>(d.index()),
                ": the HPU stand-in has one device (hpu:0)");
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return kDevice;
  }
  c10::Device getDevice() const override {
    return kDevice;
  }
  void setDevice(c10::Device d) const override {
    check(d);
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream getDefaultStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return 1;
  }
  // Work is synchronous on the host: events are always complete.
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(HPU, HPUGuardImpl);

// ---------------------------------------------------------------------------------------------
// HPU hooks: what at::getAccelerator() and torch.accelerator consult.

struct HPUHooks final : at::HPUHooksInterface {
  explicit HPUHooks(at::HPUHooksArgs) {}
  void init() const override {}
  bool hasHPU() const override {
    return true;
  }
  // at::getAccelerator() refuses two built-in accelerators (see NoCUDAHooks below).
  bool isBuilt() const override {
    return !at::detail::getCUDAHooks().isBuilt();
  }
  bool isAvailable() const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return 1;
  }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    HPUGuardImpl::check(c10::Device(kHPU, d));
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return 0;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override {
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override {
    return 0;
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return kDevice;
  }
  bool isPinnedPtr(const void*) const override {
    return false;
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return c10::GetCPUAllocator();
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return g_acquired.load();
  }
  // at::manual_seed (tch::manual_seed) seeds every accelerator's default generator, as the real
  // bridge's hooks provide one. Random ops run through the CPU fallback with the CPU generator,
  // so this one only has to exist and take seeds.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    static at::Generator gen = at::make_generator<at::CPUGeneratorImpl>();
    return gen;
  }
};

// Gaudi images run a CPU-only torch, where HPU is *the* accelerator: at::getAccelerator() says
// hpu, and the autograd engine takes HPU streams from it. On a CUDA-enabled wheel without a GPU
// (trainbook's CI) the CUDA hooks say "built" and win, and autograd on HPU tensors then asks the
// CUDA runtime for streams and fails. So the stand-in replaces the "CUDAHooks" registry entry with
// PyTorch's do-nothing base hooks (higher priority than libtorch_cuda's). This only takes effect
// if nothing asked for the CUDA hooks before the plugin was loaded; otherwise HPUHooks::isBuilt()
// steps aside and HPU autograd on such a wheel fails as described. Never load the stand-in where
// CUDA is wanted.
struct NoCUDAHooks final : at::CUDAHooksInterface {
  explicit NoCUDAHooks(at::CUDAHooksArgs) {}
};

}  // namespace trainbook_standin

namespace at {
using trainbook_standin::HPUHooks;
using trainbook_standin::NoCUDAHooks;
REGISTER_HPU_HOOKS(HPUHooks);
C10_REGISTER_TYPED_CLASS_WITH_PRIORITY(CUDAHooksRegistry, "CUDAHooks", c10::REGISTRY_PREFERRED, NoCUDAHooks)
}  // namespace at

namespace trainbook_standin {

// ---------------------------------------------------------------------------------------------
// Kernels.


constexpr c10::DispatchKeySet kHPUKeys(c10::DispatchKey::HPU);

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  if (device.has_value()) {
    HPUGuardImpl::check(*device);
  }
  return at::detail::empty_generic(size, &g_allocator, kHPUKeys, c10::dtype_or_default(dtype),
                                   memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  if (device.has_value()) {
    HPUGuardImpl::check(*device);
  }
  return at::detail::empty_strided_generic(size, stride, &g_allocator, kHPUKeys,
                                           c10::dtype_or_default(dtype));
}

// cpu<->hpu and hpu<->hpu copies: plain host copies through CPU views (handles strides, dtype
// conversion and broadcasting like CPU copy_).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.device().type() == kHPU || self.is_cpu(), "hpu stand-in: cannot copy from ",
              self.device());
  TORCH_CHECK(dst.device().type() == kHPU || dst.is_cpu(), "hpu stand-in: cannot copy to ",
              dst.device());
  if (dst.numel() == 0) {
    return dst;
  }
  at::Tensor d = host_view(dst);
  d.copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  if (self.numel() > 0) {
    host_view(self).fill_(value);
  }
  return self;
}

at::Tensor& zero(at::Tensor& self) {
  return fill_scalar(self, 0);
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, /*resizable=*/true);
  return self.set_(storage, 0, {0}, {});
}

// A real device refuses an operator that mixes its tensors with CPU tensors (other than 0-dim
// CPU scalars); the fallback would accept them, so the stand-in refuses them too, or code that
// forgot to move a tensor would pass here and fail on a Gaudi.
void check_one_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto n = op.schema().arguments().size();
  bool hpu = false, cpu = false;
  auto see = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == kHPU) hpu = true;
    else if (t.device().is_cpu() && t.dim() > 0) cpu = true;
  };
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    const auto& v = stack[i];
    if (v.isTensor()) see(v.toTensor());
    else if (v.isTensorList()) for (const at::Tensor& t : v.toTensorList()) see(t);
  }
  TORCH_CHECK(!(hpu && cpu), "Expected all tensors to be on the same device, but found at least "
              "two devices, hpu:0 and cpu! (when checking arguments for ", op.schema().name(), ")");
}

// Convolutions: ATen sends a device it has no convolution for to `convolution_overrideable`, whose
// default kernel throws, so a backend registers its own (the real bridge does). The stand-in runs
// the CPU convolution on host views of the arguments and copies the results to the device.
at::Tensor to_hpu(const at::Tensor& t) { return t.defined() ? t.to(kDevice) : t; }

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  std::optional<at::Tensor> host_bias;
  if (bias.has_value()) host_bias = host_view(*bias);
  return to_hpu(at::convolution(host_view(input), host_view(weight), host_bias, stride, padding,
                                dilation, transposed, output_padding, groups));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  // The bias has one entry per output channel.
  const int64_t channels = transposed ? weight.size(1) * groups : weight.size(0);
  const std::vector<c10::SymInt> bias_sizes{c10::SymInt(channels)};
  auto [grad_input, grad_weight, grad_bias] = at::convolution_backward_symint(
      host_view(grad_output), host_view(input), host_view(weight), c10::SymIntArrayRef(bias_sizes),
      c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding),
      c10::fromIntArrayRefSlow(dilation), transposed, c10::fromIntArrayRefSlow(output_padding),
      groups, output_mask);
  return {to_hpu(grad_input), to_hpu(grad_weight), to_hpu(grad_bias)};
}

// Ops the real bridge has no HPU kernel for (tests/hpu/missing_ops_1.19.txt, copied beside this
// library by build.sh): they run through its CPU fallback, which PT_HPU_PLACE_ON_CPU governs as in
// habana_kernels/fallback_helper.cpp (v1.19): unset or empty, every op may fall back; "none", no op
// may; otherwise only the ops it lists (comma-separated, as `aten::name.overload`). Every other op
// "has a kernel" here and runs (on the host) whatever the variable says.
struct Fallback {
  std::unordered_set<std::string> missing;
  std::unordered_set<std::string> allowed;
  bool everything = true;

  Fallback() {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&acquire_device), &info);
    std::string path = info.dli_fname != nullptr ? info.dli_fname : "";
    path = path.substr(0, path.rfind('/') + 1) + "missing_ops.txt";
    std::ifstream in(path);
    TORCH_CHECK(in.good(), "HPU stand-in: cannot read ", path, " (run tests/hpu/build.sh)");
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line[0] != '#') missing.insert(line);
    }
    // Tests add ops here to see how trainbook reports one the bridge lacks.
    const char* extra = std::getenv("TRAINBOOK_STANDIN_MISSING");
    std::stringstream more(extra != nullptr ? extra : "");
    for (std::string op; std::getline(more, op, ',');) missing.insert(op);
    const char* place = std::getenv("PT_HPU_PLACE_ON_CPU");
    if (place != nullptr && *place != '\0') {
      everything = false;
      std::stringstream list(place);
      for (std::string op; std::getline(list, op, ',');) {
        if (op != "none") allowed.insert(op);
      }
    }
  }

  void check(const c10::OperatorHandle& op) const {
    const std::string name = c10::toString(op.operator_name());
    if (missing.count(name) == 0) return;
    TORCH_CHECK(everything || allowed.count(name) != 0, name, " is not yet supported on HPU.");
  }
};

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  static const Fallback fallback;
  fallback.check(op);
  check_one_device(op, *stack);
  at::native::cpu_fallback(op, stack);
}

// layer_norm's backward with a bf16 input and fp32 weight and bias: what Gaudi's autocast makes
// (it casts only the first argument of the norms) and its kernel accepts, where the CPU kernel
// wants one dtype. Computed in fp32 on the host; each gradient gets its argument's dtype.
void layer_norm_backward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto n = op.schema().arguments().size();
  std::vector<at::ScalarType> kinds;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined()) {
      kinds.push_back(v.toTensor().scalar_type());
      v = host_view(v.toTensor()).to(at::kFloat);
    } else {
      kinds.push_back(at::kFloat);
    }
  }
  op.callBoxed(stack);
  // (grad_input, grad_weight, grad_bias) for arguments 1 (input), 5 (weight) and 6 (bias).
  const size_t of[3] = {1, 5, 6};
  for (size_t r = 0; r < 3; ++r) {
    c10::IValue& v = (*stack)[stack->size() - 3 + r];
    if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(kinds[of[r]]).to(kDevice);
  }
}

TORCH_LIBRARY_IMPL(aten, HPU, m) {
  m.impl("native_layer_norm_backward",
         torch::CppFunction::makeFromBoxedFunction<&layer_norm_backward>());
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
  m.impl("view_as_real", &at::native::view_as_real);
  m.impl("view_as_complex", &at::native::view_as_complex);
  // Storage growth goes through the storage's own allocator (ours), so CPU's resize works.
  m.impl("resize_", &at::native::resize_);
  m.impl("set_.source_Storage", static_cast<at::Tensor& (*)(at::Tensor&, c10::Storage)>(&at::native::set_));
  m.impl("set_.source_Storage_storage_offset", &at::native::set_storage_cpu_);
  m.impl("set_.source_Tensor", &at::native::set_tensor_);
  m.impl("set_", &set_empty);
  m.impl("_local_scalar_dense", &at::native::_local_scalar_dense_cpu);
  m.impl("fill_.Scalar", &fill_scalar);
  m.impl("zero_", &zero);
  m.impl("convolution_overrideable", &convolution);
  m.impl("convolution_backward_overrideable", &convolution_backward);
}

// Everything else runs on the CPU: arguments are copied to CPU, the CPU kernel runs, results and
// mutated arguments are copied back (PyTorch's generic at::native::cpu_fallback).
TORCH_LIBRARY_IMPL(_, HPU, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

// ---------------------------------------------------------------------------------------------
// The bridge's fused optimizer ops, with the schemas of habana_eager/eager_custom_op_register.cpp
// (v1.19, eager mode) and the arithmetic of its kernels: optimizer_adamw as
// hpu_ops/backend/optimizer_adamw_gen.cpp composes it (eps added to the uncorrected sqrt(v), the
// bias corrections folded by the caller into neg_step_t, weight decay as a factor on the weights);
// optimizer_sgd(_momentum) as Synapse's optimizer_sgd_bwd reference (coupled weight decay; a
// nonzero epoch_num marks the first step, whose buffer is the gradient).

std::vector<at::Tensor> host_list(const c10::IValue& v) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : v.toTensorVector()) out.push_back(host_view(t));
  return out;
}

float host_scalar(const c10::IValue& v) {
  return host_view(v.toTensor()).to(at::kFloat).item<float>();
}

void optimizer_adamw(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto a = torch::jit::last(*stack, 12);
  auto g = host_list(a[0]), w = host_list(a[1]), m = host_list(a[2]), v = host_list(a[3]);
  const float neg_step = host_scalar(a[4]), wd = host_scalar(a[8]);
  const double beta1 = a[5].toDouble(), beta2 = a[6].toDouble(), eps = a[7].toDouble();
  const bool has_wd = a[9].toBool();
  TORCH_CHECK(!w.empty(), "optimizer_adamw : can not process empty weight vector");
  TORCH_CHECK(a[10].isNone() == a[11].isNone(), "optimizer_adamw : expects both or neighter scales to be set");
  for (size_t i = 0; i < w.size(); ++i) {
    m[i].mul_(beta1).add_(g[i], 1.0 - beta1);
    v[i].mul_(beta2).addcmul_(g[i], g[i], 1.0 - beta2);
    at::Tensor update = m[i] / (v[i].sqrt() + eps) * neg_step;
    if (has_wd) w[i].mul_(wd);
    w[i].add_(update);
  }
  torch::jit::drop(*stack, 12);
  ++g_adamw_calls;
}

void sgd_update(std::vector<at::Tensor>& w, const std::vector<at::Tensor>& g,
                std::vector<at::Tensor>* bufs, bool first, float lr, float mom, double wd,
                double damp, bool nesterov) {
  for (size_t i = 0; i < w.size(); ++i) {
    at::Tensor d = g[i] + w[i] * wd;
    if (bufs != nullptr) {
      at::Tensor& b = (*bufs)[i];
      if (first) b.copy_(d);
      else b.mul_(mom).add_(d, 1.0 - damp);
      d = nesterov ? d + b * mom : b.clone();
    }
    w[i].sub_(d * lr);
  }
}

void optimizer_sgd(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto a = torch::jit::last(*stack, 7);
  auto g = host_list(a[0]), w = host_list(a[1]);
  sgd_update(w, g, nullptr, false, host_scalar(a[2]), 0.0f, a[3].toDouble(), a[5].toDouble(),
             a[6].toBool());
  torch::jit::drop(*stack, 7);
  ++g_sgd_calls;
}

void optimizer_sgd_momentum(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto a = torch::jit::last(*stack, 9);
  auto g = host_list(a[0]), w = host_list(a[1]), b = host_list(a[2]);
  const bool first = host_view(a[3].toTensor()).item<int>() != 0;
  sgd_update(w, g, &b, first, host_scalar(a[4]), host_scalar(a[5]), a[6].toDouble(),
             a[7].toDouble(), a[8].toBool());
  torch::jit::drop(*stack, 9);
  ++g_sgd_momentum_calls;
}

TORCH_LIBRARY(hpu, m) {
  m.def("optimizer_adamw(Tensor[] gradient_vec, Tensor(a!)[] weight_vec, Tensor(b!)[] exp_avg_vec, "
        "Tensor(c!)[] exp_avg_sq_vec, Tensor neg_step_t, float beta1, float beta2, float epsilon, "
        "Tensor weight_decay, bool has_weight_decay, Tensor(d!)[]? exp_avg_scales = None, "
        "Tensor(e!)[]? exp_avg_sq_scales = None) -> ()");
  m.def("optimizer_sgd(Tensor[] gradients, Tensor(a!)[] weights_in, Tensor(b!) learning_rate, "
        "float wd, float mom, float damp, bool nesterov) -> ()");
  m.def("optimizer_sgd_momentum(Tensor[] gradients, Tensor(a!)[] weights_in, Tensor(b!)[] "
        "momentum_in, Tensor epoch_num, Tensor(c!) learning_rate, Tensor(d!) mom, float wd, "
        "float damp, bool nesterov) -> ()");
}

TORCH_LIBRARY_IMPL(hpu, HPU, m) {
  m.impl("optimizer_adamw", torch::CppFunction::makeFromBoxedFunction<&optimizer_adamw>());
  m.impl("optimizer_sgd", torch::CppFunction::makeFromBoxedFunction<&optimizer_sgd>());
  m.impl("optimizer_sgd_momentum", torch::CppFunction::makeFromBoxedFunction<&optimizer_sgd_momentum>());
}

// ---------------------------------------------------------------------------------------------
// Autocast: PyTorch knows the AutocastHPU key and torch.autocast("hpu") but registers no kernels
// for it; the bridge brings its own lists (hpu_ops/autocast_helpers.h, v1.19), which differ from
// CUDA's: layer_norm, batch_norm, softmax, mean and mul run in bf16, embedding, div, exp and pow
// in fp32. Every overload of a listed op (not its in-place or out= forms) gets a boxed kernel that
// casts the floating HPU tensors among its arguments (only the first, for the norms) and calls
// the op again below autocast. PT_HPU_AUTOCAST_*_OPS_LIST (files that replace the lists) are not
// imitated.

const std::unordered_set<std::string> kLowerOps = {
    "addmm", "addbmm", "batch_norm", "baddbmm", "bmm", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "dot", "dropout",
    "feature_dropout", "group_norm", "instance_norm", "layer_norm", "leaky_relu", "linear",
    "matmul", "mean", "mm", "mul", "mv", "softmax", "log_softmax", "scaled_dot_product_attention"};
const std::unordered_set<std::string> kLowerFirstOps = {"layer_norm", "group_norm",
                                                        "instance_norm", "batch_norm"};
const std::unordered_set<std::string> kFp32Ops = {
    "acos", "addcdiv", "asin", "atan2", "bilinear", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "cdist", "cosh", "cosine_embedding_loss",
    "cosine_similarity", "cross_entropy_loss", "dist", "div", "divide", "embedding",
    "embedding_bag", "erfinv", "exp", "expm1", "hinge_embedding_loss", "huber_loss", "kl_div",
    "l1_loss", "log", "log10", "log1p", "log2", "logsumexp", "margin_ranking_loss", "mse_loss",
    "multi_margin_loss", "multilabel_margin_loss", "nll_loss", "pdist", "poisson_nll_loss", "pow",
    "reciprocal", "renorm", "rsqrt", "sinh", "smooth_l1_loss", "soft_margin_loss", "softplus", "tan",
    "topk", "triplet_margin_loss", "true_divide"};

at::Tensor autocast_cast(const at::Tensor& t, at::ScalarType to) {
  const bool eligible = t.defined() && t.device().type() == kHPU && t.is_floating_point() &&
                        t.scalar_type() != at::kDouble && t.scalar_type() != to;
  return eligible ? t.to(to) : t;
}

template <bool Lower>
void autocast_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto n = op.schema().arguments().size();
  const at::ScalarType to = Lower ? at::autocast::get_autocast_dtype(at::kHPU) : at::kFloat;
  std::string base = op.schema().name();
  base = base.substr(base.find("::") + 2);
  const bool first_only = Lower && kLowerFirstOps.count(base) != 0;
  bool cast_one = false;
  for (size_t i = stack->size() - n; i < stack->size() && !(first_only && cast_one); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = autocast_cast(v.toTensor(), to);
      cast_one = true;
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> ts = v.toTensorVector();
      for (auto& t : ts) t = autocast_cast(t, to);
      v = c10::IValue(ts);
    }
  }
  c10::impl::ExcludeDispatchKeyGuard below(c10::DispatchKey::AutocastHPU);
  op.callBoxed(stack);
}

// Registered when the plugin loads (after libtorch's own operators), for every overload.
struct AutocastLists {
  std::unique_ptr<torch::Library> lib;
  AutocastLists() {
    lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                           c10::DispatchKey::AutocastHPU, __FILE__, __LINE__);
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0 || name.overload_name.find("out") != std::string::npos) {
        continue;
      }
      const std::string base = name.name.substr(6);
      const bool lower = kLowerOps.count(base) != 0, fp32 = kFp32Ops.count(base) != 0;
      if (!lower && !fp32) continue;
      const std::string full = name.overload_name.empty() ? base : base + "." + name.overload_name;
      lib->impl(full.c_str(), lower ? torch::CppFunction::makeFromBoxedFunction<&autocast_kernel<true>>()
                                    : torch::CppFunction::makeFromBoxedFunction<&autocast_kernel<false>>());
    }
  }
};
AutocastLists g_autocast_lists;

TORCH_LIBRARY_IMPL(_, AutocastHPU, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace trainbook_standin
