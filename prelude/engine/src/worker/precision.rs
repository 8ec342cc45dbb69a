//! Numeric precision of the forward pass: float32, or bfloat16 autocast (matrix multiplies in
//! bf16, reductions and the loss in f32, master weights and optimizer state in f32 — what
//! `torch.autocast(device, dtype=torch.bfloat16)` does). bf16 needs no loss scaling.

use std::os::raw::{c_char, c_int};

use anyhow::Result;

use crate::shared::ffi::call_status;
use crate::worker::device::Device;

pub(crate) use trainbook_api::Precision;

extern "C" {
    fn tb_autocast_enter(device_type: c_int, err: *mut c_char, errlen: usize) -> c_int;
    fn tb_autocast_exit(device_type: c_int);
}

/// Runs `f` with autocast on `device` when `precision` is bf16 (plain otherwise). The region
/// is closed even when `f` fails.
pub(crate) fn autocast<T>(
    precision: Precision,
    device: Device,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if precision == Precision::Fp32 {
        return f();
    }
    let dt = device.c10_type();
    // SAFETY: the buffer is valid for its length; the call only flips thread-local autocast
    // flags.
    call_status("enabling bf16 autocast", |err, len| unsafe {
        tb_autocast_enter(dt, err, len)
    })?;
    struct Exit(c_int);
    impl Drop for Exit {
        fn drop(&mut self) {
            // SAFETY: pairs with the successful enter above.
            unsafe { tb_autocast_exit(self.0) }
        }
    }
    let _exit = Exit(dt);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::device::Device;
    use anyhow::bail;
    use tch::{Kind, Tensor};

    #[test]
    fn bf16_autocast_runs_matmuls_in_bf16_and_restores_fp32() {
        let a = Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu));
        let inside = autocast(Precision::Bf16, Device::Cpu, || Ok(a.matmul(&a).kind())).unwrap();
        assert_eq!(inside, Kind::BFloat16);
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
        let r: Result<()> = autocast(Precision::Bf16, Device::Cpu, || bail!("boom"));
        assert!(r.is_err());
        assert_eq!(
            a.matmul(&a).kind(),
            Kind::Float,
            "autocast left on after an error"
        );
        assert_eq!("BF16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert!("fp8"
            .parse::<Precision>()
            .unwrap_err()
            .to_string()
            .contains("fp32 or bf16"));
    }
}
