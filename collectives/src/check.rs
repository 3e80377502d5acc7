//! Inputs whose reductions are exact in every dtype and in every order, and their expected
//! results: how tests, the conformance suite and `xpu bench collectives` count wrong
//! elements.
//!
//! Values are small integers (−3 to 3, or 0 to 6 for unsigned types), so every partial
//! sum of up to a few hundred ranks is exact even in `bf16`. For products, exactly one
//! rank holds a 2 in each element and the others hold 1, so the product is 2 whatever the
//! order. The average follows [`ReduceOp::Avg`]'s rule exactly.

use xpu_hal::{DType, Scalar};

use crate::comm::op::ReduceOp;

fn value(dtype: DType, op: Option<ReduceOp>, rank: usize, n: usize, i: usize) -> f64 {
    match op {
        Some(ReduceOp::Prod) => {
            if (i + rank).is_multiple_of(n.max(1)) {
                2.0
            } else {
                1.0
            }
        }
        _ => {
            let v = ((i * 5 + rank * 3) % 7) as f64;
            if dtype == DType::U8 {
                v
            } else {
                v - 3.0
            }
        }
    }
}

fn encode(dtype: DType, values: impl ExactSizeIterator<Item = f64>) -> Vec<u8> {
    // The inputs take few distinct values: encode each once.
    let mut seen: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    for v in values {
        let bits = v.to_bits();
        match seen.iter().find(|(b, _)| *b == bits) {
            Some((_, bytes)) => out.extend_from_slice(bytes),
            None => {
                let bytes = Scalar::from_f64(dtype, v).to_le_bytes();
                out.extend_from_slice(&bytes);
                seen.push((bits, bytes));
            }
        }
    }
    out
}

/// Rank `rank`'s input of `elems` elements for a reduction `op` (or for data movement
/// when `None`) on `n` ranks, as little-endian bytes.
pub fn input(dtype: DType, op: Option<ReduceOp>, rank: usize, n: usize, elems: usize) -> Vec<u8> {
    encode(dtype, (0..elems).map(|i| value(dtype, op, rank, n, i)))
}

/// The reduction over `n` ranks of their [`input`]s, as little-endian bytes.
pub fn reduced(dtype: DType, op: ReduceOp, n: usize, elems: usize) -> Vec<u8> {
    let values = (0..elems).map(|i| {
        let mut acc = value(dtype, Some(op), 0, n, i);
        for r in 1..n {
            let v = value(dtype, Some(op), r, n, i);
            acc = match op {
                ReduceOp::Sum | ReduceOp::Avg => acc + v,
                ReduceOp::Prod => acc * v,
                ReduceOp::Min => acc.min(v),
                ReduceOp::Max => acc.max(v),
            };
        }
        if op == ReduceOp::Avg {
            acc = average(dtype, acc, n);
        }
        acc
    });
    encode(dtype, values)
}

/// `sum / n` by [`ReduceOp::Avg`]'s rule: floats multiply by 1/n rounded to the dtype
/// and round the product once; integers divide, truncating toward zero.
fn average(dtype: DType, sum: f64, n: usize) -> f64 {
    let n = n as f64;
    if dtype.is_float() {
        let alpha = Scalar::from_f64(dtype, 1.0 / n).to_f64();
        Scalar::from_f64(dtype, sum * alpha).to_f64()
    } else {
        (sum / n).trunc()
    }
}

/// How many elements of `got` differ from `want` (compared bit for bit; a length
/// mismatch counts every missing or extra element).
pub fn wrong_elements(dtype: DType, got: &[u8], want: &[u8]) -> usize {
    let size = dtype.size();
    let common = got.len().min(want.len()) / size;
    let differing = got
        .chunks_exact(size)
        .zip(want.chunks_exact(size))
        .filter(|(a, b)| a != b)
        .count();
    differing + (got.len().max(want.len()) / size - common)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reductions_are_what_the_rules_say() {
        // 3 ranks, element 0: values 0-3, 3-3, 6-3 = -3, 0, 3.
        let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(f(&reduced(DType::F32, ReduceOp::Sum, 3, 1)), 0.0);
        assert_eq!(f(&reduced(DType::F32, ReduceOp::Min, 3, 1)), -3.0);
        assert_eq!(f(&reduced(DType::F32, ReduceOp::Max, 3, 1)), 3.0);
        assert_eq!(f(&reduced(DType::F32, ReduceOp::Prod, 3, 1)), 2.0);
        // Element 1: 5, 1, 4 → 2, -2, 1: sum 1, integer average truncates to 0.
        let i = |b: &[u8]| i32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        assert_eq!(i(&reduced(DType::I32, ReduceOp::Sum, 3, 2)), 1);
        assert_eq!(i(&reduced(DType::I32, ReduceOp::Avg, 3, 2)), 0);
        assert_eq!(wrong_elements(DType::F32, &[0; 8], &[0; 12]), 1);
        assert_eq!(wrong_elements(DType::I32, &[0, 0, 0, 1], &[0; 4]), 1);
    }
}
