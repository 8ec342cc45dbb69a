//! A callback when a parameter's gradient is complete in the backward pass, after which the
//! gradient is dropped (`csrc/grad_hooks.cpp`): how ZeRO stage 2 moves each gradient into its
//! communication bucket while autograd is still producing the others.

use std::os::raw::{c_char, c_int, c_void};

use anyhow::Result;
use tch::Tensor;

use crate::shared::ffi::call_status;

pub(crate) type GradFn = unsafe extern "C" fn(ctx: *mut c_void, index: usize);

extern "C" {
    fn tb_take_grad_hook(
        param: *mut c_void,
        f: GradFn,
        ctx: *mut c_void,
        index: usize,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn tb_clear_grad_hook(param: *mut c_void);
}

/// A registered hook; dropping it unregisters it, so the callback never outlives its context.
pub(crate) struct TakeGradHook {
    param: Tensor,
}

impl TakeGradHook {
    /// After `param`'s gradient is accumulated, calls `f(ctx, index)` and drops the gradient.
    ///
    /// # Safety
    /// `ctx` must stay valid for `f` until the returned hook is dropped.
    pub(crate) unsafe fn register(
        param: &Tensor,
        f: GradFn,
        ctx: *mut c_void,
        index: usize,
    ) -> Result<Self> {
        let param = param.shallow_clone();
        let raw = param.as_ptr() as *mut c_void;
        // SAFETY: `raw` is a live tensor; the caller keeps `ctx` valid while the hook exists.
        call_status("registering a gradient hook", |err, len| unsafe {
            tb_take_grad_hook(raw, f, ctx, index, err, len)
        })?;
        Ok(TakeGradHook { param })
    }
}

impl Drop for TakeGradHook {
    fn drop(&mut self) {
        // SAFETY: the tensor is live; clearing a hook cannot fail.
        unsafe { tb_clear_grad_hook(self.param.as_ptr() as *mut c_void) }
    }
}
