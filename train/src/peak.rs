//! The matrix-product peak of a device, for the model FLOP utilisation (MFU) of a run:
//! the FLOP/s of a product of two `N×N` matrices in the run's compute dtype through
//! the HAL, as `xpu bench ops` measures it, best of a few runs after a warm-up.

use std::time::Instant;

use xpu_hal::ops::{Op, Tensor};
use xpu_hal::{DType, Device, Result};

/// The side of the matrices measured.
pub const PEAK_SIZE: u64 = 512;

/// FLOP/s of a [`PEAK_SIZE`]³ product of `dtype` (`f32`, `bf16` or `f16`) on
/// `device`: the best of up to five runs (fewer when one takes over 0.1 s) after one
/// to warm up.
pub fn matmul_peak(device: &Device, dtype: DType) -> Result<f64> {
    let n = PEAK_SIZE;
    let bytes = n * n * dtype.size() as u64;
    let stream = device.create_stream()?;
    let [a, b, c] = [
        device.allocate(bytes)?,
        device.allocate(bytes)?,
        device.allocate(bytes)?,
    ];
    // Small values: the product stays finite whatever the rounding.
    let ones = crate::precision::encode(&vec![0.01f32; (n * n) as usize], dtype)?;
    stream.write(&a, &ones)?;
    stream.write(&b, &ones)?;
    let op = Op::Matmul {
        a: Tensor::new(&a, dtype, &[n, n])?,
        b: Tensor::new(&b, dtype, &[n, n])?,
        c: Tensor::new(&c, dtype, &[n, n])?,
        trans_a: false,
        trans_b: false,
        alpha: 1.0,
        beta: 0.0,
    };
    let run = || -> Result<f64> {
        let t = Instant::now();
        stream.run_op(&op)?;
        stream.synchronize()?;
        Ok(t.elapsed().as_secs_f64().max(1e-9))
    };
    run()?;
    let mut best = f64::MAX;
    let mut spent = 0.0;
    for _ in 0..5 {
        let t = run()?;
        best = best.min(t);
        spent += t;
        if spent > 0.1 {
            break;
        }
    }
    Ok(2.0 * (n * n * n) as f64 / best)
}
