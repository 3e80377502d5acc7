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
use xpu_hal::{Allocation, Stream};

use crate::case::{CaseError, CaseOutcome};
use crate::cases::util::pattern;
use crate::precision::{relative_tolerance, within_tolerance};

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

/// Puts each operand in an allocation of its own on `stream`'s device (background,
/// the operand's span at its offset, guard bytes); returns the allocations and the
/// bytes each started with.
fn place(stream: &Stream, op: &Op<Spec>) -> xpu_hal::Result<(Vec<Allocation>, Vec<Vec<u8>>)> {
    let mut allocations = Vec::new();
    let mut initial = Vec::new();
    for (i, o) in op.operands().iter().enumerate() {
        let s = o.tensor;
        let total = s.offset + s.span.len() as u64 + GUARD;
        let mut bytes = pattern(0xB0 + i as u64, total as usize);
        bytes[s.offset as usize..s.offset as usize + s.span.len()].copy_from_slice(&s.span);
        let a = stream.device().allocate(total)?;
        stream.write(&a, &bytes)?;
        allocations.push(a);
        initial.push(bytes);
    }
    Ok((allocations, initial))
}

/// `op` on the tensors [`place`] made.
fn on<'a>(op: &Op<Spec>, allocations: &'a [Allocation]) -> Op<Tensor<'a>> {
    let mut next = 0;
    let mapped: Result<Op<Tensor<'a>>, std::convert::Infallible> =
        op.by_ref().try_map(|_, _, s| {
            next += 1;
            Ok(Tensor {
                allocation: &allocations[next - 1],
                offset: s.offset,
                layout: s.layout,
            })
        });
    match mapped {
        Ok(op) => op,
        Err(never) => match never {},
    }
}

/// Runs `op` on `stream` and on the reference, and compares. `what` names the trial in
/// a failure (shape, dtype, layout).
pub(crate) fn run_trial(
    stream: &Stream,
    op: &Op<Spec>,
    tolerance: Tolerance,
    what: &str,
) -> CaseOutcome {
    let kind = op.kind();
    let operands = op.operands();
    let (allocations, initial) = place(stream, op)?;
    let tensors = on(op, &allocations);
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

/// Runs `op` on `stream` (its device's memory laid out as [`run_trial`] does) and
/// returns each written operand's name, layout and elements (packed, row-major).
pub(crate) fn device_outputs(
    stream: &Stream,
    op: &Op<Spec>,
) -> xpu_hal::Result<Vec<(&'static str, Layout, Vec<u8>)>> {
    let operands = op.operands();
    let (allocations, _) = place(stream, op)?;
    let tensors = on(op, &allocations);
    stream.run_op(&tensors)?;
    stream.synchronize()?;
    let mut out = Vec::new();
    for (o, t) in operands.iter().zip(tensors.operands()) {
        if o.access.writes() {
            let bytes = stream.read(t.tensor.span())?;
            out.push((o.name, t.tensor.layout, pack(&bytes, &t.tensor.layout)));
        }
    }
    Ok(out)
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
    if within_tolerance(&g, &w, tol) {
        return Ok(());
    }
    let scale = w
        .iter()
        .filter(|v| v.is_finite())
        .fold(0.0f64, |m, v| m.max(v.abs()));
    let bad: Vec<usize> = g
        .iter()
        .zip(&w)
        .enumerate()
        .filter(|(_, (&g, &w))| {
            let ok = if w.is_nan() {
                g.is_nan()
            } else if w.is_infinite() {
                g == w
            } else {
                g.is_finite() && (g - w).abs() <= tol * (w.abs() + scale)
            };
            !ok
        })
        .map(|(i, _)| i)
        .collect();
    let i = bad.first().copied().unwrap_or(0);
    Err(format!(
        "{} of {} {dtype} elements are out of tolerance; element {i} should be {}, found {} (allowed: |got − want| ≤ {tol:e}·(|want| + {scale}))",
        bad.len().max(1),
        layout.elements(),
        w.get(i).copied().unwrap_or(f64::NAN),
        g.get(i).copied().unwrap_or(f64::NAN),
    ))
}
