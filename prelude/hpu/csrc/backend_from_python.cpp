// The C++ c10d backend of the Gaudi bridge's hccl group, handed from Python to the worker.
//
// By name (the default): bridge.py registers the group in torch's process-group registry and
// `tb_backend_from_registry` resolves it here. Only torch's own bindings touch the bridge's
// Python object, so nothing depends on how this file was compiled.
//
// By cast (TRAINBOOK_HPU_HANDOVER=cast): torch.distributed's Python classes are pybind11
// bindings holding `c10::intrusive_ptr`s, and pybind11 keeps its type registry in the
// interpreter, keyed by an internals tag (pybind11's version, compiler family, standard library,
// C++ ABI). This header-only cast finds the bindings torch and the bridge registered only when
// this file was compiled to the same tag; `tb_backend_from_python` checks that first and names
// the tags when they differ.

#include <pybind11/pybind11.h>

#include "errors.h"

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstring>
#include <exception>
#include <string>
#include <vector>

// torch declares the same holder in torch/csrc/utils/pybind.h.
PYBIND11_DECLARE_HOLDER_TYPE(T, c10::intrusive_ptr<T>, true);

namespace py = pybind11;

using trainbook::set_err;

namespace {

// The pybind11 internals tags this interpreter holds: pybind11 3 keeps them in the interpreter's
// state dict, pybind11 2 in builtins. Read before this file's own pybind11 code runs (which would
// add its tag).
std::vector<std::string> internals_tags() {
  std::vector<std::string> tags;
  auto scan = [&](PyObject* dict) {
    if (dict == nullptr) return;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(dict, &pos, &key, &value)) {
      const char* k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
      if (k != nullptr && std::strncmp(k, "__pybind11_internals_", 21) == 0) tags.emplace_back(k);
    }
  };
  scan(PyInterpreterState_GetDict(PyInterpreterState_Get()));
  scan(PyEval_GetBuiltins());
  return tags;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "none" : out;
}

}  // namespace

extern "C" {

// The tag this file was compiled to (what the cast needs the interpreter to hold).
const char* tb_pybind11_internals_id() {
  return PYBIND11_INTERNALS_ID;
}

// A new `c10::intrusive_ptr<c10d::Backend>*` for the process group registered in torch's group
// registry as `name` (its backend for `device_type`), or null with the reason.
void* tb_backend_from_registry(const char* name, int device_type, char* err, size_t errlen) {
  try {
    auto pg = c10d::resolve_process_group(name);
    auto backend = pg->getBackend(static_cast<c10::DeviceType>(device_type));
    return new c10::intrusive_ptr<c10d::Backend>(std::move(backend));
  } catch (const std::exception& e) {
    set_err(err, errlen, std::string("resolving the hccl group by name: ") + e.what());
  } catch (...) {
    set_err(err, errlen, "unknown C++ exception while resolving the hccl group by name");
  }
  return nullptr;
}

// A new `c10::intrusive_ptr<c10d::Backend>*` for `obj` (a Backend, or a ProcessGroup whose
// backend for `device_type` is taken), or null with the reason. Call with the GIL held.
void* tb_backend_from_python(PyObject* obj, int device_type, char* err, size_t errlen) {
  const std::vector<std::string> tags = internals_tags();
  const std::string ours = PYBIND11_INTERNALS_ID;
  bool shared = false;
  for (const auto& t : tags) shared = shared || t == ours;
  if (!shared) {
    set_err(err, errlen,
            "pybind11 internals differ: trainbook's hand-over helper was compiled to " + ours +
                ", but this Python's torch and Gaudi bridge registered their bindings under " +
                join(tags) +
                ", so the helper cannot see the bridge's process group. Hand it over by name "
                "instead (unset TRAINBOOK_HPU_HANDOVER; needs torch 2.3 or later), or rebuild "
                "trainbook with the compiler family, standard library and C++ ABI torch was "
                "built with");
    return nullptr;
  }
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
                ", which is neither a c10d Backend nor a ProcessGroup binding (pybind11 internals "
            "in this Python: " + join(tags) + ")");
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
