// trainbook's bridge to PyTorch's c10d: a TCPStore rendezvous and a generic c10d::ProcessGroup
// whose per-device backends are gloo (CPU tensors), NCCL (CUDA tensors, when built with
// TRAINBOOK_WITH_NCCL) and, for Intel Gaudi, the hccl backend its bridge creates. Everything crosses the C boundary as
// opaque pointers and error strings: no C++ exception may unwind into Rust.

#include "errors.h"
#include "torch_compat.h"
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef TRAINBOOK_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {
using trainbook::set_err;
using trainbook::trim_what;



template <typename F>
int guarded(char* err, size_t len, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_err(err, len, trim_what(e.what()));
  } catch (...) {
    set_err(err, len, "unknown C++ exception in c10d");
  }
  return -1;
}

std::chrono::milliseconds ms(int64_t v) { return std::chrono::milliseconds(v); }

}  // namespace

struct tb_store {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

struct tb_pg {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::chrono::milliseconds timeout;
};

struct tb_work {
  c10::intrusive_ptr<c10d::Work> work;
  std::chrono::milliseconds timeout;
};

extern "C" {

int tb_have_nccl() {
#ifdef TRAINBOOK_WITH_NCCL
  return 1;
#else
  return 0;
#endif
}

// The most CUDA memory the caching allocator has handed out on `device` since the process
// started (torch.cuda.max_memory_allocated); -1 in builds without CUDA or on error.
int64_t tb_cuda_peak_bytes(int device) {
#ifdef TRAINBOOK_WITH_NCCL
  try {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  } catch (...) {
    return -1;
  }
#else
  (void)device;
  return -1;
#endif
}

// Hosts the rendezvous store. port 0 lets the kernel pick a free port atomically (no
// probe-then-bind race); the chosen port comes back through port_out.
tb_store* tb_store_server(const char* host, uint16_t port, int64_t timeout_ms, uint16_t* port_out,
                          char* err, size_t errlen) {
  tb_store* out = nullptr;
  guarded(err, errlen, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = true;
    opts.waitWorkers = false;
    opts.timeout = ms(timeout_ms);
    auto store = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
    if (port_out) *port_out = store->getPort();
    out = new tb_store{store};
  });
  return out;
}

void tb_store_free(tb_store* s) { delete s; }

// Connects to a store another process hosts (node 0's driver, for the drivers of other nodes).
tb_store* tb_store_client(const char* host, uint16_t port, int64_t timeout_ms, char* err,
                          size_t errlen) {
  tb_store* out = nullptr;
  guarded(err, errlen, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = ms(timeout_ms);
    out = new tb_store{c10::make_intrusive<c10d::TCPStore>(std::string(host), opts)};
  });
  return out;
}

int tb_store_set(tb_store* s, const char* key, const uint8_t* data, size_t len, char* err,
                 size_t errlen) {
  return guarded(err, errlen, [&] {
    s->store->set(std::string(key), std::vector<uint8_t>(data, data + len));
  });
}

// Whether `key` exists, without waiting.
int tb_store_check(tb_store* s, const char* key, int* exists, char* err, size_t errlen) {
  return guarded(err, errlen, [&] { *exists = s->store->check({std::string(key)}) ? 1 : 0; });
}

// Waits (up to the store's timeout) for `key`; the value is returned in a malloc'd buffer the
// caller frees with tb_bytes_free.
int tb_store_get(tb_store* s, const char* key, uint8_t** out, size_t* out_len, char* err,
                 size_t errlen) {
  return guarded(err, errlen, [&] {
    auto v = s->store->get(std::string(key));
    *out = static_cast<uint8_t*>(std::malloc(v.size() ? v.size() : 1));
    if (*out == nullptr) throw std::runtime_error("out of memory");
    if (!v.empty()) std::memcpy(*out, v.data(), v.size());
    *out_len = v.size();
  });
}

void tb_bytes_free(uint8_t* p) { std::free(p); }

// Creates the process group. is_server: this rank hosts the store itself (torch.distributed's
// env:// contract, rank 0 hosts); otherwise it connects to an existing store (trainbook's
// launcher hosts it so the port can be chosen race-free).
tb_pg* tb_pg_new(const char* backend, const char* master_addr, uint16_t port, int rank, int world,
                 int is_server, int64_t timeout_ms, const char* gloo_ifname,
                 const char* gloo_host, const char* store_prefix, char* err, size_t errlen) {
  tb_pg* out = nullptr;
  guarded(err, errlen, [&] {
    std::string be(backend);
    c10d::TCPStoreOptions opts;
    opts.port = port;
    opts.isServer = is_server != 0;
    opts.numWorkers = world;
    opts.waitWorkers = false;
    opts.timeout = ms(timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(master_addr), opts);
    auto store = c10::make_intrusive<c10d::PrefixStore>(std::string(store_prefix), tcp);
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);

    if (be == "gloo" || be == "nccl" || be == "hccl") {
      // gloo always serves CPU tensors: metrics and barriers work whatever the device.
      auto gopts = c10d::ProcessGroupGloo::Options::create(ms(timeout_ms));
      std::string addr(master_addr);
      // Where this rank's gloo connections live: the interface the user named, else the
      // node's own address (several nodes on one machine use distinct loopback addresses),
      // else loopback for a job on one machine, else the host name's address.
      if (gloo_ifname != nullptr && gloo_ifname[0] != '\0') {
        gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(gloo_ifname));
      } else if (gloo_host != nullptr && gloo_host[0] != '\0') {
        gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(gloo_host));
      } else if (addr == "127.0.0.1" || addr == "localhost") {
        gopts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        gopts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      gopts->threads = 2;
      auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, world, gopts);
      pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
      pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
    }
    if (be == "nccl") {
#ifdef TRAINBOOK_WITH_NCCL
      auto nopts = c10d::ProcessGroupNCCL::Options::create();
      nopts->timeout = ms(timeout_ms);
      auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          c10::make_intrusive<c10d::PrefixStore>("nccl", store), rank, world, nopts);
      pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
#else
      throw std::runtime_error(
          "this trainbook build has no NCCL backend: rebuild on a CUDA machine "
          "(make setup detects the GPU, or set TRAINBOOK_CUDA=1)");
#endif
    } else if (be == "hccl") {
      // The HPU backend comes from Intel Gaudi's bridge, which creates it in Python on this
      // store; the worker attaches it with tb_pg_set_backend before the first HPU collective.
    } else if (be != "gloo") {
      throw std::runtime_error("unknown c10d backend '" + be + "' (expected gloo, nccl or hccl)");
    }
    out = new tb_pg{pg, ms(timeout_ms)};
  });
  return out;
}

void tb_pg_free(tb_pg* p) { delete p; }

// Serves tensors of `device_type` (c10::DeviceType) with `backend`, an owned
// `c10::intrusive_ptr<c10d::Backend>*` made by a device plugin (Gaudi's hccl). Collectives on
// such tensors dispatch to the plugin's c10d kernels, which look the backend up here.
int tb_pg_set_backend(tb_pg* p, int device_type, void* backend, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    auto b = *static_cast<c10::intrusive_ptr<c10d::Backend>*>(backend);
    p->pg->setBackend(static_cast<c10::DeviceType>(device_type),
                      c10d::ProcessGroup::BackendType::CUSTOM, b);
  });
}

int tb_pg_rank(const tb_pg* p) { return p->pg->getRank(); }
int tb_pg_size(const tb_pg* p) { return p->pg->getSize(); }

// op: 0 sum, 1 max, 2 min, 3 product. Averages are done by the caller (gloo has no AVG).
static c10d::ReduceOp to_op(int op) {
  switch (op) {
    case 1: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case 2: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    case 3: return c10d::ReduceOp(c10d::ReduceOp::PRODUCT);
    default: return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }
}

static std::vector<at::Tensor> gather_tensors(void* const* tensors, size_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(*static_cast<at::Tensor*>(tensors[i]));
  return v;
}

// Starts an allreduce of one tensor and returns a handle to wait on, so callers can overlap the
// next bucket's packing with this bucket's communication.
tb_work* tb_pg_allreduce_start(tb_pg* p, void* tensor, int op, char* err, size_t errlen) {
  tb_work* out = nullptr;
  guarded(err, errlen, [&] {
    std::vector<at::Tensor> v{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions o;
    o.reduceOp = to_op(op);
    o.timeout = p->timeout;
    out = new tb_work{p->pg->allreduce(v, o), p->timeout};
  });
  return out;
}

// ZeRO's two collectives (their names in this torch: torch_compat.h), started like the
// all-reduce so buckets overlap. Both take one flat tensor of world * shard elements and a
// shard-sized one; the process group's dispatcher picks the backend from the tensors' device
// (gloo, nccl or a device plugin's, e.g. hccl).
tb_work* tb_pg_reduce_scatter_start(tb_pg* p, void* output, void* input, char* err, size_t errlen) {
  tb_work* out = nullptr;
  guarded(err, errlen, [&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = p->timeout;
    out = new tb_work{p->pg->TB_REDUCE_SCATTER_FLAT(*static_cast<at::Tensor*>(output),
                                                   *static_cast<at::Tensor*>(input), o),
                      p->timeout};
  });
  return out;
}

tb_work* tb_pg_allgather_start(tb_pg* p, void* output, void* input, char* err, size_t errlen) {
  tb_work* out = nullptr;
  guarded(err, errlen, [&] {
    c10d::AllgatherOptions o;
    o.timeout = p->timeout;
    out = new tb_work{p->pg->TB_ALLGATHER_FLAT(*static_cast<at::Tensor*>(output),
                                               *static_cast<at::Tensor*>(input), o),
                      p->timeout};
  });
  return out;
}

int tb_work_wait(tb_work* w, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    if (!w->work->wait(w->timeout)) throw std::runtime_error("collective did not complete");
  });
}

void tb_work_free(tb_work* w) { delete w; }

int tb_pg_allreduce(tb_pg* p, void* const* tensors, size_t n, int op, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    // A vector passed to c10d's allreduce means "one replica per device", not "several
    // tensors": issue one collective per tensor, all in flight before waiting.
    auto v = gather_tensors(tensors, n);
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : v) {
      std::vector<at::Tensor> one{t};
      c10d::AllreduceOptions o;
      o.reduceOp = to_op(op);
      o.timeout = p->timeout;
      works.push_back(p->pg->allreduce(one, o));
    }
    for (auto& w : works) w->wait(p->timeout);
  });
}

int tb_pg_broadcast(tb_pg* p, void* const* tensors, size_t n, int root, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    // One call per tensor: c10d's broadcast takes one tensor per device.
    for (size_t i = 0; i < n; ++i) {
      std::vector<at::Tensor> v{*static_cast<at::Tensor*>(tensors[i])};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.timeout = p->timeout;
      p->pg->broadcast(v, o)->wait(p->timeout);
    }
  });
}

int tb_pg_barrier(tb_pg* p, char* err, size_t errlen) {
  return guarded(err, errlen, [&] {
    c10d::BarrierOptions o;
    o.timeout = p->timeout;
    p->pg->barrier(o)->wait(p->timeout);
  });
}

}  // extern "C"
