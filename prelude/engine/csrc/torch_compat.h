// The C++ APIs that differ between the torch releases trainbook builds with (the pin, 2.13, and
// the Gaudi image's 2.11: scripts/torch-pair.sh --buildable). Every such difference is gated
// here, once, on the headers' own version, so the .cpp files use one spelling.
// scripts/check-torch-pairs.sh compiles every csrc file against each claimed torch's headers.
#pragma once

#include <torch/headeronly/version.h>

#include <memory>
#include <utility>

#include <c10/util/intrusive_ptr.h>

#define TB_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// torch 2.12 renamed ProcessGroup's flat collectives (`_reduce_scatter_base` and
// `_allgather_base` stay as deprecated aliases there).
#if TB_TORCH_AT_LEAST(2, 12)
#define TB_REDUCE_SCATTER_FLAT reduce_scatter_single
#define TB_ALLGATHER_FLAT all_gather_single
#else
#define TB_REDUCE_SCATTER_FLAT _reduce_scatter_base
#define TB_ALLGATHER_FLAT _allgather_base
#endif

namespace trainbook {

// torch 2.13 holds autograd nodes in c10::intrusive_ptr; 2.12 and earlier in std::shared_ptr
// (`Node : std::enable_shared_from_this<Node>`). set_history and Edge take whichever it is.
template <class NodeT, class... Args>
auto make_autograd_node(Args&&... args) {
#if TB_TORCH_AT_LEAST(2, 13)
  return c10::make_intrusive<NodeT>(std::forward<Args>(args)...);
#else
  return std::make_shared<NodeT>(std::forward<Args>(args)...);
#endif
}

}  // namespace trainbook
