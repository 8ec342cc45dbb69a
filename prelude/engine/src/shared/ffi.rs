//! The one way a C++ error crosses into Rust. Every C++ helper of trainbook's (the c10d shim,
//! device moves, the fused optimizers, autocast, the HPU bridge's backend) takes an error
//! buffer and its length as its last two arguments, catches every C++ exception (an exception
//! unwinding into Rust would abort the worker with no message), and writes the exception's
//! message there, NUL-terminated, when it fails.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use anyhow::{bail, Result};

/// Room for a C++ exception's message (c10's carry a backtrace and are truncated to fit).
const ERR_LEN: usize = 4096;

/// Calls `f` with an error buffer; when `failed(&result)`, fails with "`what` failed: <the
/// message the helper wrote>".
pub fn call<T>(
    what: &str,
    f: impl FnOnce(*mut c_char, usize) -> T,
    failed: impl Fn(&T) -> bool,
) -> Result<T> {
    let mut buf = vec![0 as c_char; ERR_LEN];
    let out = f(buf.as_mut_ptr(), ERR_LEN);
    if failed(&out) {
        // The helpers NUL-terminate within the length they are given; the last byte is kept
        // 0 here too, so a helper that overran its message still yields a C string.
        buf[ERR_LEN - 1] = 0;
        // SAFETY: `buf` is NUL-terminated (above) and lives until the end of this block.
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        bail!("{what} failed: {}", msg.trim());
    }
    Ok(out)
}

/// [`call`] for a helper that returns 0 on success.
pub fn call_status(what: &str, f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<()> {
    call(what, f, |rc| *rc != 0).map(|_| ())
}

/// [`call`] for a helper that returns a pointer, null on failure.
pub fn call_ptr<P>(what: &str, f: impl FnOnce(*mut c_char, usize) -> *mut P) -> Result<*mut P> {
    call(what, f, |p| p.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(buf: *mut c_char, len: usize, msg: &str) {
        let bytes = msg.as_bytes();
        let n = bytes.len().min(len - 1);
        for (i, b) in bytes[..n].iter().enumerate() {
            // SAFETY: i < len, inside the buffer `call` handed out.
            unsafe { *buf.add(i) = *b as c_char };
        }
        // SAFETY: n < len.
        unsafe { *buf.add(n) = 0 };
    }

    #[test]
    fn a_failure_carries_the_helpers_message_and_what_was_tried() {
        let e = call_status("allreduce", |buf, len| {
            write(buf, len, "Connection closed by peer [127.0.0.1]:1234\n");
            1
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "allreduce failed: Connection closed by peer [127.0.0.1]:1234"
        );
        let e = call_ptr::<u8>("moving a tensor to hpu:0", |buf, len| {
            write(buf, len, "device not found");
            std::ptr::null_mut()
        })
        .unwrap_err()
        .to_string();
        assert_eq!(e, "moving a tensor to hpu:0 failed: device not found");
    }

    #[test]
    fn success_returns_the_result_and_ignores_the_buffer() {
        assert!(call_status("barrier", |_, _| 0).is_ok());
        let mut x = 7u8;
        let p = call_ptr("store", |_, _| &mut x as *mut u8).unwrap();
        assert_eq!(p, &mut x as *mut u8);
        assert_eq!(call("count", |_, _| 3, |n| *n < 0).unwrap(), 3);
    }

    #[test]
    fn a_message_that_fills_the_buffer_is_cut_not_overrun() {
        let long = "x".repeat(2 * ERR_LEN);
        let e = call_status("broadcast", |buf, len| {
            write(buf, len, &long);
            1
        })
        .unwrap_err()
        .to_string();
        assert_eq!(e.len(), "broadcast failed: ".len() + ERR_LEN - 1);
    }
}
