// The C++ c10d backend behind a Python backend object. torch.distributed's Python classes are
// pybind11 bindings holding `c10::intrusive_ptr`s; the Gaudi bridge's hccl backend is one of
// them. pybind11 keeps its type registry in the interpreter, so this header-only cast finds the
// bindings torch and the bridge registered, without linking libtorch_python.

#include <pybind11/pybind11.h>

#include "errors.h"

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstring>
#include <exception>
#include <string>

// torch declares the same holder in torch/csrc/utils/pybind.h.
PYBIND11_DECLARE_HOLDER_TYPE(T, c10::intrusive_ptr<T>, true);

namespace py = pybind11;

using trainbook::set_err;

extern "C" {

// A new `c10::intrusive_ptr<c10d::Backend>*` for `obj` (a Backend, or a ProcessGroup whose
// backend for `device_type` is taken), or null with the reason. Call with the GIL held.
void* tb_backend_from_python(PyObject* obj, int device_type, char* err, size_t errlen) {
  try {
    py::handle h(obj);
    try {
      auto backend = h.cast<c10::intrusive_ptr<c10d::Backend>>();
      return new c10::intrusive_ptr<c10d::Backend>(std::move(backend));
    } catch (const py::cast_error&) {
    }
    auto pg = h.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
    auto backend = pg->getBackend(static_cast<c10::DeviceType>(device_type));
    return new c10::intrusive_ptr<c10d::Backend>(std::move(backend));
  } catch (const py::cast_error&) {
    std::string type = py::str(py::type::of(py::handle(obj)));
    set_err(err, errlen,
            "the hccl constructor returned " + type +
                ", which is neither a c10d Backend nor a ProcessGroup binding");
  } catch (const std::exception& e) {
    set_err(err, errlen, e.what());
  } catch (...) {
    set_err(err, errlen, "unknown C++ exception while taking the hccl backend");
  }
  return nullptr;
}

void tb_backend_free(void* holder) {
  delete static_cast<c10::intrusive_ptr<c10d::Backend>*>(holder);
}
}
