//! Embedding lookups: gather (rows copied byte for byte, any dtype) and scatter-add
//! (rows added into the table in the computing precision, rounded once per element).
//! Indices are checked before anything is written.

use xpu_hal::{DType, Error, Result};

use super::access::Plan;
use super::elementwise::min_rows;
use super::math::Elem;
use super::{with_float, Par};

/// The reference's error for an index outside `[0, rows)`, naming the first one.
fn check_indices(indices: &[i32], rows: usize) -> Result<()> {
    match indices
        .iter()
        .enumerate()
        .find(|&(_, &v)| v < 0 || v as usize >= rows)
    {
        Some((i, v)) => Err(Error::invalid(format!(
            "index at position {i} is {v}, outside [0, {rows}); the operation was not carried out"
        ))),
        None => Ok(()),
    }
}

/// `out[i, :] = table[indices[i], :]`, bit for bit.
pub(super) fn gather(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> Result<bool> {
    Ok(match dtype.size() {
        1 => gather_typed::<u8>(plan, par)?,
        2 => gather_typed::<u16>(plan, par)?,
        4 => gather_typed::<u32>(plan, par)?,
        8 => gather_typed::<u64>(plan, par)?,
        _ => false,
    })
}

fn gather_typed<T: bytemuck::Pod + Send + Sync>(plan: &Plan<'_>, par: &Par<'_>) -> Result<bool> {
    let Some(&[rows, dim]) = plan.dims(0) else {
        return Ok(false);
    };
    let (rows, dim) = (rows as usize, dim as usize);
    let (Some(table), Some(indices)) = (plan.input::<T>(0), plan.input::<i32>(1)) else {
        return Ok(false);
    };
    check_indices(indices, rows)?;
    let Some(out) = plan.output::<T>(2) else {
        return Ok(false);
    };
    let piece = par.piece(indices.len(), min_rows(dim)) * dim;
    par.chunks(out, piece, |start, out| {
        for (r, o) in out.chunks_exact_mut(dim).enumerate() {
            let row = indices[start / dim + r] as usize;
            o.copy_from_slice(&table[row * dim..(row + 1) * dim]);
        }
    });
    Ok(true)
}

/// `table[indices[i], :] += src[i, :]`: the table's rows shared between the threads,
/// each walking all indices in order and adding those that land in its rows, in the
/// computing precision (`f32` for `f32`, `f16`, `bf16`), rounding once.
pub(super) fn scatter_add(plan: &Plan<'_>, par: &Par<'_>, dtype: DType) -> Result<bool> {
    Ok(with_float!(dtype, E => scatter_add_typed::<E>(plan, par)?))
}

fn scatter_add_typed<E: Elem>(plan: &Plan<'_>, par: &Par<'_>) -> Result<bool> {
    let Some(&[rows, dim]) = plan.dims(2) else {
        return Ok(false);
    };
    let (rows, dim) = (rows as usize, dim as usize);
    let (Some(src), Some(indices)) = (plan.input::<E>(0), plan.input::<i32>(1)) else {
        return Ok(false);
    };
    check_indices(indices, rows)?;
    let Some(table) = plan.output::<E>(2) else {
        return Ok(false);
    };
    let piece = par.piece(rows, min_rows(dim)) * dim;
    par.chunks(table, piece, |start, chunk| {
        let (first, count) = (start / dim, chunk.len() / dim);
        let mut acc: Vec<E::F> = chunk.iter().map(|v| v.get()).collect();
        let mut touched = vec![false; count];
        for (i, &row) in indices.iter().enumerate() {
            let Some(r) = (row as usize).checked_sub(first).filter(|&r| r < count) else {
                continue;
            };
            touched[r] = true;
            let a = &mut acc[r * dim..(r + 1) * dim];
            for (a, &s) in a.iter_mut().zip(&src[i * dim..(i + 1) * dim]) {
                *a = *a + s.get();
            }
        }
        for (r, t) in touched.iter().enumerate() {
            if *t {
                for (o, &a) in chunk[r * dim..(r + 1) * dim]
                    .iter_mut()
                    .zip(&acc[r * dim..(r + 1) * dim])
                {
                    *o = E::put(a);
                }
            }
        }
    });
    Ok(true)
}
