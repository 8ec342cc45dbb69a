//! Activation checkpointing: trade compute for memory by keeping a block's inputs instead of
//! the activations its backward pass needs, and running the block again in the backward pass.
//!
//! A transformer layer saves about 17 of its hidden-size tensors per token for the backward
//! pass (BERT, fp32; more with dropout); a checkpointed layer saves one, its input. The cost is
//! one more forward pass of the layer per step. The autograd node that does this is C++
//! (`csrc/recompute.cpp`, since tch has no custom autograd functions); it calls back into the
//! Rust closure given here for both forward passes, restoring the random generators (dropout
//! draws the same masks) and the autocast flags of the first one, so the result is the run
//! without checkpointing.

use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use anyhow::Result;
use tch::Tensor;
use torch_sys::C_tensor;

use crate::shared::ffi::call_status;

type ForwardFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    inputs: *const *mut c_void,
    n: usize,
    out: *mut *mut c_void,
    err: *mut c_char,
    errlen: usize,
) -> c_int;
type DropFn = unsafe extern "C" fn(ctx: *mut c_void);

extern "C" {
    fn tb_checkpointed(
        inputs: *const *mut c_void,
        n: usize,
        forward: ForwardFn,
        ctx: *mut c_void,
        drop: DropFn,
        out: *mut *mut c_void,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
}

/// The block, owned by the autograd node until the backward pass (or the graph) is done with it.
struct Block(Box<dyn Fn(&[Tensor]) -> Tensor>);

/// `f(inputs)`, with only `inputs` kept for the backward pass, which runs `f` again. Use it in
/// a model's forward pass around a block whose activations are large (a transformer layer);
/// `f` must compute the same function both times from the inputs and the parameters it
/// captures. In evaluation (no gradient mode) it simply runs `f`.
///
/// `f` runs in the backward pass on the thread autograd runs it on (the caller's on CPU), so
/// it should hold shared handles (`Arc`) of what it reads, not borrow it.
pub fn checkpointed(
    inputs: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Tensor + 'static,
) -> Result<Tensor> {
    let raw: Vec<*mut c_void> = inputs.iter().map(|t| t.as_ptr() as *mut c_void).collect();
    let ctx = Box::into_raw(Box::new(Block(Box::new(f)))) as *mut c_void;
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the inputs are live tensors for the call; `ctx` is a `Block` that the C++ side
    // releases through `drop_block` exactly once (when the call fails too); `out` receives a
    // new tensor that is ours.
    call_status("a checkpointed forward pass", |err, len| unsafe {
        tb_checkpointed(
            raw.as_ptr(),
            raw.len(),
            forward,
            ctx,
            drop_block,
            &mut out,
            err,
            len,
        )
    })?;
    // SAFETY: on success `out` is a heap `at::Tensor*` handed over to us.
    Ok(unsafe { Tensor::from_ptr(out as *mut C_tensor) })
}

unsafe extern "C" fn forward(
    ctx: *mut c_void,
    inputs: *const *mut c_void,
    n: usize,
    out: *mut *mut c_void,
    err: *mut c_char,
    errlen: usize,
) -> c_int {
    // SAFETY: `ctx` is the live `Block` of `checkpointed`; each input is a new `at::Tensor*`
    // the C++ side hands over.
    let block = unsafe { &*(ctx as *const Block) };
    let inputs: Vec<Tensor> = (0..n)
        .map(|i| unsafe { Tensor::from_ptr(*inputs.add(i) as *mut C_tensor) })
        .collect();
    match catch_unwind(AssertUnwindSafe(|| (block.0)(&inputs))) {
        Ok(mut t) => {
            // SAFETY: `out` is valid; the tensor's ownership goes to the C++ side.
            unsafe { *out = t.as_mut_ptr() as *mut c_void };
            std::mem::forget(t);
            0
        }
        Err(payload) => {
            let msg = crate::worker::task::panic_text(payload.as_ref());
            let bytes = msg.as_bytes();
            let n = bytes.len().min(errlen.saturating_sub(1));
            // SAFETY: `err` holds `errlen` bytes; `n < errlen`.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, err, n);
                *err.add(n) = 0;
            }
            -1
        }
    }
}

unsafe extern "C" fn drop_block(ctx: *mut c_void) {
    // SAFETY: called once, by the owner of the `Block` made in `checkpointed`.
    drop(unsafe { Box::from_raw(ctx as *mut Block) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Reduction};

    /// A two-layer block with dropout, run plainly and checkpointed from the same seed: the
    /// same output, the same gradients for its weights and its input.
    #[test]
    fn a_checkpointed_block_gives_the_gradients_of_the_plain_one() {
        let opts = (Kind::Float, tch::Device::Cpu);
        let w1 = Tensor::randn([8, 16], opts).set_requires_grad(true);
        let w2 = Tensor::randn([16, 8], opts).set_requires_grad(true);
        let x0 = Tensor::randn([4, 8], opts);
        let block = std::rc::Rc::new({
            let (w1, w2) = (w1.shallow_clone(), w2.shallow_clone());
            move |ins: &[Tensor]| {
                ins[0]
                    .matmul(&w1)
                    .gelu("none")
                    .dropout(0.3, true)
                    .matmul(&w2)
            }
        });
        let run = |checkpoint: bool| {
            for w in [&w1, &w2] {
                let mut g = w.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let x = x0.copy().set_requires_grad(true);
            tch::manual_seed(7);
            let h = x.tanh();
            let y = if checkpoint {
                let b = block.clone();
                checkpointed(&[&h], move |ins: &[Tensor]| b(ins)).unwrap()
            } else {
                block(&[h.shallow_clone()])
            };
            // A draw after the block: checkpointing must leave the generator where it was.
            let after = Tensor::rand([3], opts);
            y.mse_loss(&Tensor::ones_like(&y), Reduction::Mean)
                .backward();
            (
                y.detach(),
                x.grad(),
                w1.grad().copy(),
                w2.grad().copy(),
                after,
            )
        };
        let plain = run(false);
        let ckpt = run(true);
        for (a, b) in [
            (&plain.0, &ckpt.0),
            (&plain.1, &ckpt.1),
            (&plain.2, &ckpt.2),
            (&plain.3, &ckpt.3),
            (&plain.4, &ckpt.4),
        ] {
            let d = (a - b).abs().max().double_value(&[]);
            assert!(d < 1e-6, "checkpointed differs by {d}");
        }
    }

    #[test]
    fn without_gradients_it_simply_runs_and_errors_come_back() {
        let x = Tensor::ones([2, 2], (Kind::Float, tch::Device::Cpu));
        let y = tch::no_grad(|| checkpointed(&[&x], |ins| &ins[0] * 2.0)).unwrap();
        assert_eq!(y.sum(Kind::Float).double_value(&[]), 8.0);
        let x = x.set_requires_grad(true);
        let e = checkpointed(&[&x], |_| panic!("shapes do not fit")).unwrap_err();
        assert!(format!("{e:#}").contains("shapes do not fit"), "{e:#}");
    }
}
