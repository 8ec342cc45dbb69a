// Test stand-in for the bridge's eager HCCL module (_hccl_eager_C): a pybind11 module exposing
// ProcessGroupHCCL, a c10d::Backend subclass (Python base: torch.distributed._Backend, holder
// c10::intrusive_ptr), plus the c10d collective kernels for the HPU dispatch key, which PyTorch's
// own Ops.cpp registers only for CPU, CUDA and PrivateUse1.
//
// The collectives run on gloo: each ProcessGroupHCCL owns a c10d::ProcessGroupGloo (loopback
// device, its own PrefixStore over the store it was given). The stand-in's HPU memory is host
// memory, so HPU tensors are handed to gloo as CPU tensors over the same memory (no copy);
// non-contiguous tensors go through a contiguous copy that is written back when the work is
// waited on.
//
// As unkind as the bridge's ProcessGroupEagerHCCL (process_group_eager_hccl.cpp, v1.19): no
// collective times out (the timeout given to the constructor, setTimeout() and wait() are
// ignored), a peer that dies leaves the others waiting forever (gloo's "connection closed" is
// turned into a hang), abort() is not supported (it throws, as the bridge's assert does), and
// the destructor waits in an untimed barrier on the store for every rank to destroy its group
// too, then rank 0 in the destroy handshake; after the store is gone, their exceptions end the
// process (std::terminate).
// Used only by tests: see tests/hpu/README.md.

#include "host_view.h"
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <pybind11/chrono.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <string>
#include <utility>
#include <vector>

namespace trainbook_standin {

using c10d::OpType;


// Host tensors for one collective, and the write-backs needed for non-contiguous outputs.
struct Staging {
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (hpu destination, host source)

  at::Tensor in(const at::Tensor& t) {
    at::Tensor v = host_view(t);
    return v.is_contiguous() ? v : v.contiguous();
  }
  at::Tensor out(const at::Tensor& t) {
    at::Tensor v = host_view(t);
    if (v.is_contiguous()) {
      return v;
    }
    at::Tensor c = v.contiguous();
    copy_back.emplace_back(t, c);
    return c;
  }
  std::vector<at::Tensor> in(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> r;
    for (const auto& t : ts) r.push_back(in(t));
    return r;
  }
  std::vector<at::Tensor> out(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> r;
    for (const auto& t : ts) r.push_back(out(t));
    return r;
  }
  std::vector<std::vector<at::Tensor>> in(const std::vector<std::vector<at::Tensor>>& ts) {
    std::vector<std::vector<at::Tensor>> r;
    for (const auto& t : ts) r.push_back(in(t));
    return r;
  }
  std::vector<std::vector<at::Tensor>> out(const std::vector<std::vector<at::Tensor>>& ts) {
    std::vector<std::vector<at::Tensor>> r;
    for (const auto& t : ts) r.push_back(out(t));
    return r;
  }
};

// What HCCL does when a peer is gone: nothing more. The process waits until it is killed.
[[noreturn]] void hang_forever(const char* why) {
  std::fprintf(stderr,
               "hccl (trainbook stand-in): a collective failed (%s); HCCL has no timeout, so this "
               "rank waits forever, as on a Gaudi\n",
               why);
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// Wraps gloo's work: result() gives the HPU tensors; wait() also performs the write-backs.
class HostWork : public c10d::Work {
 public:
  HostWork(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> outputs,
           std::vector<std::pair<at::Tensor, at::Tensor>> copy_back, OpType type)
      : c10d::Work(-1, type),
        inner_(std::move(inner)),
        outputs_(std::move(outputs)),
        copy_back_(std::move(copy_back)) {}

  bool isCompleted() override {
    return inner_->isCompleted();
  }
  std::exception_ptr exception() const override {
    return inner_->exception();
  }
  int sourceRank() const override {
    return inner_->sourceRank();
  }
  std::vector<at::Tensor> result() override {
    return outputs_;
  }
  void synchronize() override {
    inner_->synchronize();
  }
  // The timeout is ignored, as the bridge's WorkEager::wait does; a failed collective (a peer
  // gone) never returns, as with HCCL.
  bool wait(std::chrono::milliseconds /* timeout */ = ::kNoTimeout) override {
    bool ok = false;
    try {
      ok = inner_->wait(::kNoTimeout);
    } catch (const std::exception& e) {
      hang_forever(e.what());
    }
    std::call_once(copied_, [this] {
      for (auto& [dst, src] : copy_back_) host_view(dst).copy_(src);
    });
    return ok;
  }
  void abort() override {
    TORCH_INTERNAL_ASSERT(false, "hccl (trainbook stand-in): abort() is not supported by the "
                          "eager HCCL work, as in the Gaudi bridge");
  }
  // The future's values are gloo's host tensors (they share memory with the HPU tensors).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!copy_back_.empty()) {
      wait();
    }
    return inner_->getFuture();
  }
  uint64_t getSequencenumber() const override {
    return inner_->getSequencenumber();
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::vector<at::Tensor> outputs_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back_;
  std::once_flag copied_;
};

c10::intrusive_ptr<c10d::Work> wrap(c10::intrusive_ptr<c10d::Work> work, std::vector<at::Tensor> outputs,
                                    Staging& s, OpType type) {
  return c10::make_intrusive<HostWork>(std::move(work), std::move(outputs), std::move(s.copy_back), type);
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<at::Tensor> r;
  for (const auto& v : ts) r.insert(r.end(), v.begin(), v.end());
  return r;
}

class ProcessGroupEagerHCCL : public c10d::Backend {
 public:
  ProcessGroupEagerHCCL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                        std::string group_name, std::chrono::milliseconds /* ignored */)
      : c10d::Backend(rank, size) {
    // A day: longer than any test, i.e. no timeout.
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::hours(24));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->group_name = group_name;
    store_ = c10::make_intrusive<c10d::PrefixStore>("hccl_standin", store);
    gloo_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank, size, opts);
  }

  // The bridge's destructor (process_group_hccl_base.cpp): hostBarrier(), every rank marks the
  // store and polls it until all have; then destroyHandshake(), every rank marks another key and
  // rank 0, which "hosts the store", waits for all of them. No timeout anywhere; exceptions (the
  // store is gone) escape a noexcept destructor.
  ~ProcessGroupEagerHCCL() override {
    auto wait_for_all = [this](const std::string& key) {
      while (store_->add(key, 0) < getSize()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    store_->add("host_barrier", 1);
    wait_for_all("host_barrier");
    store_->add("ProcessGroup::destroy", 1);
    if (getRank() == 0) wait_for_all("ProcessGroup::destroy");
  }

  const std::string getBackendName() const override {
    return "hccl";
  }
  void setTimeout(std::chrono::milliseconds /* ignored, as by the bridge */) override {}

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    Staging s;
    auto h = s.out(tensors);
    return wrap(gloo_->broadcast(h, opts), tensors, s, OpType::BROADCAST);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    Staging s;
    auto h = s.out(tensors);
    return wrap(gloo_->allreduce(h, opts), tensors, s, OpType::ALLREDUCE);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    Staging s;
    auto h = s.out(tensors);
    return wrap(gloo_->allreduce_coalesced(h, opts), tensors, s, OpType::ALLREDUCE_COALESCED);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    Staging s;
    auto h = s.out(tensors);
    return wrap(gloo_->reduce(h, opts), tensors, s, OpType::REDUCE);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->allgather(o, i, opts), flat(outputs), s, OpType::ALLGATHER);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    Staging s;
    auto o = s.out(output);
    auto i = s.in(input);
    return wrap(gloo_->_allgather_base(o, i, opts), {output}, s, OpType::_ALLGATHER_BASE);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->allgather_coalesced(o, i, opts), flat(outputs), s, OpType::ALLGATHER_COALESCED);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->allgather_into_tensor_coalesced(o, i, opts), outputs, s, OpType::COALESCED);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->gather(o, i, opts), flat(outputs), s, OpType::GATHER);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->scatter(o, i, opts), outputs, s, OpType::SCATTER);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->reduce_scatter(o, i, opts), outputs, s, OpType::REDUCE_SCATTER);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    Staging s;
    auto o = s.out(output);
    auto i = s.in(input);
    return wrap(gloo_->_reduce_scatter_base(o, i, opts), {output}, s, OpType::_REDUCE_SCATTER_BASE);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->reduce_scatter_tensor_coalesced(o, i, opts), outputs, s, OpType::COALESCED);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    Staging s;
    auto o = s.out(output);
    auto i = s.in(input);
    return wrap(gloo_->alltoall_base(o, i, output_split_sizes, input_split_sizes, opts), {output}, s,
                OpType::ALLTOALL_BASE);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    Staging s;
    auto o = s.out(outputs);
    auto i = s.in(inputs);
    return wrap(gloo_->alltoall(o, i, opts), outputs, s, OpType::ALLTOALL);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    Staging s;
    auto h = s.in(tensors);
    return wrap(gloo_->send(h, dst, tag), tensors, s, OpType::SEND);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    Staging s;
    auto h = s.out(tensors);
    return wrap(gloo_->recv(h, src, tag), tensors, s, OpType::RECV);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    Staging s;
    auto h = s.out(tensors);
    return wrap(gloo_->recvAnysource(h, tag), tensors, s, OpType::RECVANYSOURCE);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    Staging s;
    return wrap(gloo_->barrier(opts), {}, s, OpType::BARRIER);
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    gloo_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override {
    gloo_->setSequenceNumberForGroup();
  }
  uint64_t getSequenceNumberForGroup() override {
    return gloo_->getSequenceNumberForGroup();
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo_;
};

// ---------------------------------------------------------------------------------------------
// c10d ops for the HPU key: the same forwarding as PyTorch's Ops.cpp does for CPU/CUDA.

using PG = c10::intrusive_ptr<c10d::ProcessGroup>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using TensorsWork = std::tuple<std::vector<at::Tensor>, WorkPtr>;
using c10d::ReduceOp;

c10::intrusive_ptr<c10d::Backend> hpu_backend(const PG& pg) {
  return pg->getBackend(c10::DeviceType::HPU);
}
std::chrono::milliseconds ms(int64_t t) {
  return std::chrono::milliseconds(t);
}

WorkPtr send_hpu(at::TensorList tensors, const PG& pg, int64_t dst, int64_t tag) {
  auto v = tensors.vec();
  return hpu_backend(pg)->send(v, static_cast<int>(dst), static_cast<int>(tag));
}
WorkPtr recv_hpu(at::TensorList tensors, const PG& pg, int64_t src, int64_t tag) {
  auto v = tensors.vec();
  return hpu_backend(pg)->recv(v, static_cast<int>(src), static_cast<int>(tag));
}
WorkPtr recv_any_source_hpu(at::TensorList tensors, const PG& pg, int64_t tag) {
  auto v = tensors.vec();
  return hpu_backend(pg)->recvAnysource(v, static_cast<int>(tag));
}
WorkPtr reduce_hpu(at::TensorList tensors, const PG& pg, const c10::intrusive_ptr<ReduceOp>& op,
                   int64_t root_rank, int64_t root_tensor, bool async_op, int64_t timeout) {
  auto v = tensors.vec();
  return hpu_backend(pg)->reduce(v, c10d::ReduceOptions{*op, root_rank, root_tensor, ms(timeout), async_op});
}
TensorsWork broadcast_hpu(at::TensorList tensors, const PG& pg, int64_t root_rank, int64_t root_tensor,
                          bool async_op, int64_t timeout) {
  auto v = tensors.vec();
  auto work = hpu_backend(pg)->broadcast(v, c10d::BroadcastOptions{root_rank, root_tensor, ms(timeout), async_op});
  return TensorsWork(std::move(v), work);
}
TensorsWork allreduce_hpu(at::TensorList tensors, const PG& pg, const c10::intrusive_ptr<ReduceOp>& op,
                          const std::optional<at::Tensor>& sparse_indices, bool async_op, int64_t timeout) {
  auto v = tensors.vec();
  auto work = hpu_backend(pg)->allreduce(v, c10d::AllreduceOptions{*op, ms(timeout), async_op});
  return TensorsWork(std::move(v), work);
}
WorkPtr allreduce_coalesced_hpu(at::TensorList tensors, const PG& pg, const c10::intrusive_ptr<ReduceOp>& op,
                                bool async_op, int64_t timeout) {
  auto v = tensors.vec();
  c10d::AllreduceCoalescedOptions opts;
  opts.reduceOp = *op;
  opts.timeout = ms(timeout);
  opts.asyncOp = async_op;
  return hpu_backend(pg)->allreduce_coalesced(v, opts);
}
std::tuple<std::vector<std::vector<at::Tensor>>, WorkPtr> allgather_hpu(
    const std::vector<std::vector<at::Tensor>>& outputs, at::TensorList inputs, const PG& pg, bool async_op,
    int64_t timeout) {
  auto in = inputs.vec();
  auto work = hpu_backend(pg)->allgather(const_cast<std::vector<std::vector<at::Tensor>>&>(outputs), in,
                                         c10d::AllgatherOptions{ms(timeout), async_op});
  return {outputs, work};
}
std::tuple<at::Tensor, WorkPtr> allgather_base_hpu(at::Tensor& output, at::Tensor& input, const PG& pg,
                                                   bool async_op, int64_t timeout) {
  auto work = hpu_backend(pg)->_allgather_base(output, input, c10d::AllgatherOptions{ms(timeout), async_op});
  return {output, work};
}
WorkPtr allgather_coalesced_hpu(const std::vector<std::vector<at::Tensor>>& outputs, const at::TensorList& inputs,
                                const PG& pg, bool async_op) {
  auto in = inputs.vec();
  c10d::AllgatherOptions opts;
  opts.asyncOp = async_op;
  return hpu_backend(pg)->allgather_coalesced(const_cast<std::vector<std::vector<at::Tensor>>&>(outputs), in, opts);
}
WorkPtr allgather_into_tensor_coalesced_hpu(at::TensorList outputs, at::TensorList inputs, const PG& pg,
                                            bool async_op) {
  auto o = outputs.vec();
  auto i = inputs.vec();
  c10d::AllgatherOptions opts;
  opts.asyncOp = async_op;
  return hpu_backend(pg)->allgather_into_tensor_coalesced(o, i, opts);
}
TensorsWork reduce_scatter_hpu(const at::TensorList& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
                               const PG& pg, const c10::intrusive_ptr<ReduceOp>& op, bool async_op, int64_t timeout) {
  auto o = outputs.vec();
  auto work = hpu_backend(pg)->reduce_scatter(o, const_cast<std::vector<std::vector<at::Tensor>>&>(inputs),
                                              c10d::ReduceScatterOptions{*op, ms(timeout), async_op});
  return TensorsWork(o, work);
}
std::tuple<at::Tensor, WorkPtr> reduce_scatter_base_hpu(at::Tensor& output, at::Tensor& input, const PG& pg,
                                                        const c10::intrusive_ptr<ReduceOp>& op, bool async_op,
                                                        int64_t timeout) {
  auto work = hpu_backend(pg)->_reduce_scatter_base(output, input,
                                                    c10d::ReduceScatterOptions{*op, ms(timeout), async_op});
  return {output, work};
}
WorkPtr reduce_scatter_tensor_coalesced_hpu(at::TensorList outputs, at::TensorList inputs, const PG& pg,
                                            const c10::intrusive_ptr<ReduceOp>& op, bool async_op, int64_t timeout) {
  auto o = outputs.vec();
  auto i = inputs.vec();
  return hpu_backend(pg)->reduce_scatter_tensor_coalesced(o, i, c10d::ReduceScatterOptions{*op, ms(timeout), async_op});
}
WorkPtr gather_hpu(const std::vector<std::vector<at::Tensor>>& outputs, const at::TensorList& inputs, const PG& pg,
                   int64_t root_rank, bool async_op, int64_t timeout) {
  auto in = inputs.vec();
  return hpu_backend(pg)->gather(const_cast<std::vector<std::vector<at::Tensor>>&>(outputs), in,
                                 c10d::GatherOptions{root_rank, ms(timeout), async_op});
}
TensorsWork scatter_hpu(const at::TensorList& outputs, const std::vector<std::vector<at::Tensor>>& inputs,
                        const PG& pg, int64_t root_rank, bool async_op, int64_t timeout) {
  auto o = outputs.vec();
  auto work = hpu_backend(pg)->scatter(o, const_cast<std::vector<std::vector<at::Tensor>>&>(inputs),
                                       c10d::ScatterOptions{root_rank, ms(timeout), async_op});
  return TensorsWork(std::move(o), work);
}
TensorsWork alltoall_hpu(const at::TensorList& outputs, const at::TensorList& inputs, const PG& pg, bool async_op,
                         int64_t timeout) {
  auto o = outputs.vec();
  auto i = inputs.vec();
  auto work = hpu_backend(pg)->alltoall(o, i, c10d::AllToAllOptions{ms(timeout), async_op});
  return TensorsWork(std::move(o), work);
}
WorkPtr alltoall_base_hpu(at::Tensor& output, at::Tensor& input, const PG& pg, std::vector<int64_t> output_split_sizes,
                          std::vector<int64_t> input_split_sizes, bool async_op, int64_t timeout) {
  return hpu_backend(pg)->alltoall_base(output, input, output_split_sizes, input_split_sizes,
                                        c10d::AllToAllOptions{ms(timeout), async_op});
}
WorkPtr barrier_hpu(at::Tensor /* unused */, const PG& pg, const std::vector<int64_t>& device_ids, bool async_op,
                    int64_t timeout) {
  c10d::BarrierOptions opts;
  opts.device_ids = device_ids;
  opts.timeout = ms(timeout);
  opts.asyncOp = async_op;
  return hpu_backend(pg)->barrier(opts);
}

TORCH_LIBRARY_IMPL(c10d, HPU, m) {
  m.impl("send", send_hpu);
  m.impl("recv_", recv_hpu);
  m.impl("recv_any_source_", recv_any_source_hpu);
  m.impl("reduce_", reduce_hpu);
  m.impl("broadcast_", broadcast_hpu);
  m.impl("allreduce_", allreduce_hpu);
  m.impl("allreduce_coalesced_", allreduce_coalesced_hpu);
  m.impl("allgather_", allgather_hpu);
  m.impl("_allgather_base_", allgather_base_hpu);
  m.impl("allgather_coalesced_", allgather_coalesced_hpu);
  m.impl("allgather_into_tensor_coalesced_", allgather_into_tensor_coalesced_hpu);
  m.impl("reduce_scatter_", reduce_scatter_hpu);
  m.impl("_reduce_scatter_base_", reduce_scatter_base_hpu);
  m.impl("reduce_scatter_tensor_coalesced_", reduce_scatter_tensor_coalesced_hpu);
  m.impl("gather_", gather_hpu);
  m.impl("scatter_", scatter_hpu);
  m.impl("alltoall_", alltoall_hpu);
  m.impl("alltoall_base_", alltoall_base_hpu);
  m.impl("barrier", barrier_hpu);
}

}  // namespace trainbook_standin

namespace py = pybind11;

PYBIND11_MODULE(_hccl_eager_C, module) {
  using trainbook_standin::ProcessGroupEagerHCCL;
  module.doc() = "trainbook test stand-in for the Gaudi bridge's eager HCCL module (collectives on gloo)";
  py::object backend = py::module_::import("torch.distributed").attr("_Backend");
  py::class_<ProcessGroupEagerHCCL, c10::intrusive_ptr<ProcessGroupEagerHCCL>>(module, "ProcessGroupHCCL", backend)
      // The real bridge's constructor: (store, rank, size, group_name). The stand-in also takes
      // an optional timeout (default: c10d's 30 minutes).
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::string group_name,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupEagerHCCL>(store, rank, size, std::move(group_name), timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("group_name"),
           py::arg("timeout") = ::kBackendDefaultTimeout, py::call_guard<py::gil_scoped_release>())
      // The older form (store, rank, size, timeout), as register_backend's non-extended API passes.
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return c10::make_intrusive<ProcessGroupEagerHCCL>(store, rank, size, "", timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>());
}
