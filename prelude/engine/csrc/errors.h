// How trainbook's C++ helpers report failure to Rust: a message written into the caller's
// buffer, never an exception (a C++ exception unwinding into Rust aborts the process).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

namespace trainbook {

// Copies `msg` into `err` (at most len - 1 bytes, always NUL-terminated).
inline void set_err(char* err, size_t len, const std::string& msg) {
  if (err == nullptr || len == 0) return;
  size_t n = msg.size() < len - 1 ? msg.size() : len - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// c10 error messages carry a long C++ stack trace after the first part of interest; keep the
// head so Rust errors stay readable (libtorch logs the full text itself).
inline std::string trim_what(const char* what) {
  std::string s(what);
  auto pos = s.find("\nException raised from");
  if (pos != std::string::npos) s.resize(pos);
  return s;
}

// Runs `body` (which returns 0 on success) and turns any exception into -1 with its message
// in `err`: the common tail of the functions Rust calls.
template <class F>
int report_errors(char* err, size_t len, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    set_err(err, len, trim_what(e.what()));
  } catch (...) {
    set_err(err, len, "unknown C++ exception");
  }
  return -1;
}

}  // namespace trainbook
