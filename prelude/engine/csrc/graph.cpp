// CUDA graphs for a whole training step (libtorch's at::cuda::CUDAGraph): capture the step's
// work once on a side stream, then replay it with one launch. Streams and events go through
// c10's device-generic interface (libc10_cuda registers CUDA's), so trainbook needs no CUDA
// runtime symbol of its own. Builds without CUDA answer every call with an error.

#include "errors.h"
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstddef>
#include <exception>
#include <memory>

#ifdef TRAINBOOK_WITH_NCCL
#include <ATen/cuda/CUDAGraph.h>
#endif

namespace {
using trainbook::set_err;
using trainbook::trim_what;
}  // namespace

#ifdef TRAINBOOK_WITH_NCCL
struct tb_graph {
  at::cuda::CUDAGraph graph;
  c10::Device device;
  // The stream that was current before the capture, restored after it.
  c10::Stream previous;
};

namespace {
// `later` waits (on the device) for the work queued on `first` so far.
void order(const c10::Stream& first, const c10::Stream& later) {
  c10::Event e(c10::DeviceType::CUDA);
  e.record(first);
  e.block(later);
}
}  // namespace
#else
struct tb_graph {};
#endif

extern "C" {

// A new graph whose capture has begun on a side stream of CUDA device `index`, which becomes
// the current stream (waiting for the work queued before). Only this thread's work is
// captured (thread-local mode): the data loader's threads may go on using CUDA meanwhile.
tb_graph* tb_graph_capture_begin(int index, char* err, size_t errlen) {
#ifdef TRAINBOOK_WITH_NCCL
  try {
    c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    c10::Stream previous = impl.getStream(device);
    c10::Stream side = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    order(previous, side);
    impl.exchangeStream(side);
    auto g = std::unique_ptr<tb_graph>(new tb_graph{{}, device, previous});
    try {
      g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    } catch (...) {
      impl.exchangeStream(previous);
      throw;
    }
    return g.release();
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return nullptr;
#else
  (void)index;
  set_err(err, errlen, "this trainbook was built without CUDA: CUDA graphs need the cuda build");
  return nullptr;
#endif
}

// Ends the capture and makes the stream current before it current again (waiting for the
// side stream). Nothing captured has run yet: replay it.
int tb_graph_capture_end(tb_graph* g, char* err, size_t errlen) {
#ifdef TRAINBOOK_WITH_NCCL
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  c10::Stream side = impl.getStream(g->device);
  try {
    g->graph.capture_end();
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
    impl.exchangeStream(g->previous);
    return -1;
  }
  impl.exchangeStream(g->previous);
  order(side, g->previous);
  return 0;
#else
  (void)g;
  set_err(err, errlen, "this trainbook was built without CUDA");
  return -1;
#endif
}

// Runs the captured work once more, on the current stream.
int tb_graph_replay(tb_graph* g, char* err, size_t errlen) {
#ifdef TRAINBOOK_WITH_NCCL
  try {
    g->graph.replay();
    return 0;
  } catch (const std::exception& e) {
    set_err(err, errlen, trim_what(e.what()));
  }
  return -1;
#else
  (void)g;
  set_err(err, errlen, "this trainbook was built without CUDA");
  return -1;
#endif
}

void tb_graph_free(tb_graph* g) { delete g; }
}
