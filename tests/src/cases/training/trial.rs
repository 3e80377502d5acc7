//! Running one standard operation on the device and on the reference, from the same
//! bytes, and comparing what each wrote.
//!
//! Every operand gets an allocation of its own: background bytes, the operand starting
//! at an element-aligned offset into it, and guard bytes after it. Inputs hold their
//! values where the layout addresses them (the gaps of a strided layout keep the
//! background); outputs start as background. After the operation, bytes the layout
//! does not address (guards, gaps, every byte of a read-only operand) must be
//! unchanged, and the addressed elements must match the reference within the
//! tolerance of their dtype ([`Tolerance`]).

use xpu_hal::ops::{HasLayout, Layout, Op, Tensor};
use xpu_hal::reference::ops::{from_f64, pack, run, to_f64, unpack, Buffers};
use xpu_hal::{DType, Stream};

use crate::case::{CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{pattern, upload};

/// Guard bytes after each operand.
const GUARD: u64 = 48;

/// One operand of a trial: a layout at `offset` bytes into its own allocation, and the
/// bytes it spans before the operation.
#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) layout: Layout,
    pub(crate) offset: u64,
    pub(crate) span: Vec<u8>,
}

impl HasLayout for Spec {
    fn layout(&self) -> &Layout {
        &self.layout
    }
}

impl Spec {
    /// An input holding `values` (row-major, one per element), at an offset of `skip`
    /// elements.
    pub(crate) fn input(layout: Layout, values: &[f64], skip: u64, seed: u64) -> Spec {
        let mut span = pattern(seed, layout.span_bytes() as usize);
        unpack(&mut span, &layout, &from_f64(values, layout.dtype));
        Spec {
            layout,
            offset: skip * layout.dtype.size() as u64,
            span,
        }
    }

    /// An input holding raw element bytes (row-major, packed).
    pub(crate) fn input_bytes(layout: Layout, packed: &[u8], skip: u64, seed: u64) -> Spec {
        let mut span = pattern(seed, layout.span_bytes() as usize);
        unpack(&mut span, &layout, packed);
        Spec {
            layout,
            offset: skip * layout.dtype.size() as u64,
            span,
        }
    }

    /// An output: background bytes only.
    pub(crate) fn output(layout: Layout, skip: u64, seed: u64) -> Spec {
        Spec {
            layout,
            offset: skip * layout.dtype.size() as u64,
            span: pattern(seed ^ 0x5a5a, layout.span_bytes() as usize),
        }
    }
}

/// How close a result must be to the reference (computed in `f64` and rounded to the
/// dtype). For float results not compared exactly, element `i` passes when
/// `|got − want| ≤ tol·(|want| + max|want|)` over the finite reference values of the
/// tensor, where `tol` is 1e-9 for `f64`, 1e-4 for `f32`, 2e-3 for `f16` (about four
/// units in the last place) and 1.6e-2 for `bf16` (likewise); a NaN must be NaN and an
/// infinity the same infinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tolerance {
    /// Bit for bit (copies, comparisons, integer outputs).
    Exact,
    /// The per-dtype tolerance above.
    Dtype,
}

/// The relative tolerance for `dtype` (see [`Tolerance`]).
pub(crate) fn relative_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Runs `op` on `stream` and on the reference, and compares. `what` names the trial in
/// a failure (shape, dtype, layout).
pub(crate) fn run_trial(
    ctx: &CaseContext,
    stream: &Stream,
    op: &Op<Spec>,
    tolerance: Tolerance,
    what: &str,
) -> CaseOutcome {
    let kind = op.kind();
    let operands = op.operands();
    // Device memory: background, the span, guards.
    let mut allocations = Vec::new();
    let mut initial = Vec::new();
    for (i, o) in operands.iter().enumerate() {
        let s = o.tensor;
        let total = s.offset + s.span.len() as u64 + GUARD;
        let mut bytes = pattern(0xB0 + i as u64, total as usize);
        bytes[s.offset as usize..s.offset as usize + s.span.len()].copy_from_slice(&s.span);
        allocations.push(upload(&ctx.device, stream, &bytes)?);
        initial.push(bytes);
    }
    let mut next = 0;
    let tensors = op.by_ref().try_map(|_, _, s| {
        let t = Tensor {
            allocation: &allocations[next],
            offset: s.offset,
            layout: s.layout,
        };
        next += 1;
        Ok::<_, CaseError>(t)
    })?;
    stream
        .run_op(&tensors)
        .map_err(|e| CaseError::fail(format!("{kind} ({what}) was refused: {e}")))?;
    stream
        .synchronize()
        .map_err(|e| CaseError::fail(format!("{kind} ({what}) failed on the device: {e}")))?;
    // The reference, from the same spans.
    let mut spans: Vec<Vec<u8>> = operands.iter().map(|o| o.tensor.span.clone()).collect();
    let mut index = 0;
    let indexed = op.by_ref().try_map(|_, _, s| {
        index += 1;
        Ok::<_, CaseError>((index - 1, s.layout))
    })?;
    run(
        &indexed,
        &mut Buffers {
            buffers: &mut spans,
        },
    )
    .map_err(|e| {
        CaseError::fail(format!(
            "internal error: the reference refused {kind} ({what}): {e}"
        ))
    })?;
    for (i, o) in operands.iter().enumerate() {
        let got = stream.read(&allocations[i])?;
        let s = o.tensor;
        let (start, end) = (s.offset as usize, s.offset as usize + s.span.len());
        let mut want_bytes = initial[i].clone();
        want_bytes[start..end].copy_from_slice(&spans[i]);
        if !o.access.writes() {
            if got != initial[i] {
                return Err(CaseError::fail(format!(
                    "{kind} ({what}) changed its input {}",
                    o.name
                )));
            }
            continue;
        }
        // Bytes outside the addressed elements: unchanged.
        let mut masked_got = got.clone();
        let addressed = pack(&want_bytes[start..end], &s.layout);
        unpack(&mut masked_got[start..end], &s.layout, &addressed);
        if masked_got != want_bytes {
            let first = masked_got
                .iter()
                .zip(&want_bytes)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(CaseError::fail(format!(
                "{kind} ({what}) wrote byte {first} of {}'s allocation, outside the elements its layout ({}) addresses at offset {}",
                o.name, s.layout, s.offset
            )));
        }
        compare(
            &pack(&got[start..end], &s.layout),
            &addressed,
            &s.layout,
            tolerance,
        )
        .map_err(|m| CaseError::fail(format!("{kind} ({what}): {}: {m}", o.name)))?;
    }
    Ok(())
}

/// Compares packed elements; the message names the first element out of tolerance.
pub(crate) fn compare(
    got: &[u8],
    want: &[u8],
    layout: &Layout,
    tolerance: Tolerance,
) -> Result<(), String> {
    let dtype = layout.dtype;
    if tolerance == Tolerance::Exact || !dtype.is_float() {
        if got == want {
            return Ok(());
        }
        let size = dtype.size();
        let i = got
            .chunks(size)
            .zip(want.chunks(size))
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        let (g, w) = (
            to_f64(&got[i * size..(i + 1) * size], dtype)[0],
            to_f64(&want[i * size..(i + 1) * size], dtype)[0],
        );
        return Err(format!(
            "element {i} (of {}) should be exactly {w} ({:02x?}), found {g} ({:02x?})",
            layout.elements(),
            &want[i * size..(i + 1) * size],
            &got[i * size..(i + 1) * size]
        ));
    }
    let g = to_f64(got, dtype);
    let w = to_f64(want, dtype);
    let tol = relative_tolerance(dtype);
    let scale = w
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let mut bad = 0usize;
    let mut first = None;
    for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            g.is_finite() && (g - w).abs() <= tol * (w.abs() + scale)
        };
        if !ok {
            bad += 1;
            first.get_or_insert((i, g, w));
        }
    }
    match first {
        None => Ok(()),
        Some((i, g, w)) => Err(format!(
            "{bad} of {} {dtype} elements are out of tolerance; element {i} should be {w}, found {g} (allowed: |got − want| ≤ {tol:e}·(|want| + {scale}))",
            layout.elements()
        )),
    }
}
