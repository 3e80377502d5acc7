//! The standard operations ([`xpu_hal::ops`]) on host device memory.
//!
//! - Matrix multiply goes through the `matrixmultiply` crate ([`matmul`]).
//! - The others have fast paths for contiguous tensors of the float dtypes (`f32` and
//!   `f64` computed in their own precision, `f16` and `bf16` widened to `f32` and
//!   rounded once), split over the device's threads: [`elementwise`], [`rows`],
//!   [`optim`], [`index`] and [`random`].
//! - Anything else (strided or broadcast tensors, overlapping operands the fast paths
//!   do not handle) goes through the HAL's reference ([`xpu_hal::reference::ops`]),
//!   which defines what every path must match.

mod access;
mod elementwise;
mod index;
mod math;
mod matmul;
mod optim;
mod random;
mod rows;

use std::sync::{Arc, OnceLock};

use rayon::prelude::*;
use xpu_hal::ops::{Op, OpSupport, RawTensor};
use xpu_hal::reference::ops::{pack, run, unpack, TensorIo};
use xpu_hal::{DType, Error, Result};

use crate::memory::Region;

use access::Plan;

/// What the host devices provide: every standard operation on every dtype it is
/// defined on.
pub(crate) fn supported() -> Vec<OpSupport> {
    OpSupport::all(&DType::ALL)
}

/// The threads one host device uses for an operation: `XPU_HOST_THREADS` when set,
/// else the machine's cores shared between the `devices` (at least 1).
pub(crate) fn threads_from_env(devices: u32) -> Result<usize> {
    match std::env::var("XPU_HOST_THREADS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(Error::invalid(format!(
                "XPU_HOST_THREADS is `{v}`; set it to the threads each host device may use for an operation (1 to 1024)"
            ))),
        },
        Err(_) => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Ok((cores / devices.max(1) as usize).max(1))
        }
    }
}

/// Operations touching fewer bytes than this run on the calling thread: waking the
/// pool would cost more than it saves.
const PARALLEL_BYTES: u64 = 64 << 10;

/// A device's threads for operations, shared by its streams; the pool starts on the
/// first operation large enough to use it.
pub(crate) struct OpThreads {
    threads: usize,
    pool: OnceLock<std::result::Result<rayon::ThreadPool, String>>,
}

impl OpThreads {
    pub(crate) fn new(threads: usize) -> Arc<Self> {
        Arc::new(OpThreads {
            threads,
            pool: OnceLock::new(),
        })
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// The device's pool, started on first use.
    fn pool(&self) -> Result<&rayon::ThreadPool> {
        let pool = self.pool.get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(self.threads)
                .thread_name(|i| format!("xpu-host-op{i}"))
                .build()
                .map_err(|e| e.to_string())
        });
        pool.as_ref().map_err(|e| {
            Error::backend_message(
                "host",
                format!("could not start the device's operation threads: {e}"),
            )
        })
    }

    /// How to split an operation touching `bytes` bytes: over the pool, or on the
    /// calling thread when there is one thread or little work.
    fn par(&self, bytes: u64) -> Result<Par<'_>> {
        if self.threads <= 1 || bytes < PARALLEL_BYTES {
            return Ok(Par::SEQUENTIAL);
        }
        Ok(Par {
            pool: Some(self.pool()?),
            threads: self.threads,
        })
    }
}

/// Where the pieces of one operation run: on the device's pool, or in order on the
/// calling thread.
#[derive(Clone, Copy)]
pub(super) struct Par<'p> {
    pool: Option<&'p rayon::ThreadPool>,
    threads: usize,
}

impl Par<'_> {
    /// Everything on the calling thread.
    pub(super) const SEQUENTIAL: Par<'static> = Par {
        pool: None,
        threads: 1,
    };

    /// The threads the pieces are shared between (1 when sequential).
    pub(super) fn threads(&self) -> usize {
        self.threads
    }

    /// The length of the pieces to cut `items` items into: about four per thread (so
    /// uneven pieces even out), each at least `min` items; one piece when sequential.
    pub(super) fn piece(&self, items: usize, min: usize) -> usize {
        match self.pool {
            None => items.max(1),
            Some(_) => items.div_ceil(self.threads * 4).max(min).max(1),
        }
    }

    /// `f` of every item, in order, the items shared between the threads.
    pub(super) fn map<I: Send, R: Send>(
        &self,
        items: Vec<I>,
        f: impl Fn(I) -> R + Sync + Send,
    ) -> Vec<R> {
        match self.pool {
            Some(pool) if items.len() > 1 => {
                pool.install(|| items.into_par_iter().map(f).collect())
            }
            _ => items.into_iter().map(f).collect(),
        }
    }

    /// `f(start, chunk)` for the pieces of `out` of `piece` items (the last may be
    /// shorter), `start` being the index of the piece's first item in `out`.
    pub(super) fn chunks<T: Send, R: Send>(
        &self,
        out: &mut [T],
        piece: usize,
        f: impl Fn(usize, &mut [T]) -> R + Sync + Send,
    ) -> Vec<R> {
        let piece = piece.max(1);
        let items: Vec<(usize, &mut [T])> = out
            .chunks_mut(piece)
            .enumerate()
            .map(|(i, c)| (i * piece, c))
            .collect();
        self.map(items, |(start, c)| f(start, c))
    }
}

/// Reads and writes host device memory for the reference.
struct HostIo;

impl TensorIo<RawTensor> for HostIo {
    fn read(&mut self, t: &RawTensor) -> Result<Vec<u8>> {
        let region = Region::from_raw(&t.memory)?;
        // SAFETY: the HAL checked the span is in bounds of a live allocation (held by
        // `region`), and stream order makes this worker the only one touching operands
        // now; the slice does not outlive this call, so it overlaps no written slice.
        Ok(pack(unsafe { region.bytes() }, &t.layout))
    }

    fn write(&mut self, t: &RawTensor, packed: &[u8]) -> Result<()> {
        let region = Region::from_raw(&t.memory)?;
        // SAFETY: as in `read`; no other slice of these bytes lives during this call.
        unpack(unsafe { region.bytes_mut() }, &t.layout, packed);
        Ok(())
    }
}

/// Runs a checked standard operation (see [`xpu_hal::backend::StreamImpl::run_op`]).
pub(crate) fn execute(op: &Op<RawTensor>, threads: &OpThreads) -> Result<()> {
    if let Op::Matmul {
        a,
        b,
        c,
        trans_a,
        trans_b,
        alpha,
        beta,
    } = op
    {
        return matmul::matmul(
            matmul::Matmul {
                a,
                b,
                c,
                trans_a: *trans_a,
                trans_b: *trans_b,
                alpha: *alpha,
                beta: *beta,
            },
            threads,
        );
    }
    if let Some(plan) = Plan::new(op)? {
        let par = threads.par(plan.bytes())?;
        if fast(op, &plan, &par)? {
            return Ok(());
        }
    }
    run(op, &mut HostIo)
}

/// Runs `op` on a fast path if there is one for its dtypes and layouts: `Ok(false)`
/// (having written nothing) when there is none.
fn fast(op: &Op<RawTensor>, plan: &Plan<'_>, par: &Par<'_>) -> Result<bool> {
    Ok(match op {
        Op::Matmul { .. } => false,
        Op::BiasAdd { x, .. } => elementwise::bias_add(plan, par, x.layout.dtype),
        Op::Relu { x, .. } => elementwise::relu(plan, par, x.layout.dtype),
        Op::ReluBackward { x, .. } => elementwise::relu_backward(plan, par, x.layout.dtype),
        Op::Gelu { x, .. } => elementwise::gelu(plan, par, x.layout.dtype),
        Op::GeluBackward { x, .. } => elementwise::gelu_backward(plan, par, x.layout.dtype),
        Op::Softmax { x, .. } => rows::softmax(plan, par, x.layout.dtype),
        Op::SoftmaxBackward { y, .. } => rows::softmax_backward(plan, par, y.layout.dtype),
        Op::CrossEntropy { logits, .. } => rows::cross_entropy(plan, par, logits.layout.dtype)?,
        Op::CrossEntropyBackward { logits, .. } => {
            rows::cross_entropy_backward(plan, par, logits.layout.dtype)?
        }
        Op::LayerNorm { x, eps, .. } => rows::layer_norm(plan, par, x.layout.dtype, *eps),
        Op::LayerNormBackward { x, .. } => rows::layer_norm_backward(plan, par, x.layout.dtype),
        Op::Reduce { x, op, axis, .. } => {
            rows::reduce(plan, par, x.layout.dtype, *op, *axis as usize)
        }
        Op::Gather { table, .. } => index::gather(plan, par, table.layout.dtype)?,
        Op::ScatterAdd { table, .. } => index::scatter_add(plan, par, table.layout.dtype)?,
        Op::SgdMomentum {
            param,
            lr,
            momentum,
            weight_decay,
            nesterov,
            ..
        } => optim::sgd_momentum(
            plan,
            par,
            param.layout.dtype,
            optim::Sgd {
                lr: *lr,
                momentum: *momentum,
                weight_decay: *weight_decay,
                nesterov: *nesterov,
            },
        ),
        Op::AdamW {
            param,
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            step,
            ..
        } => optim::adamw(
            plan,
            par,
            param.layout.dtype,
            optim::Adam {
                lr: *lr,
                beta1: *beta1,
                beta2: *beta2,
                eps: *eps,
                weight_decay: *weight_decay,
                step: *step,
            },
        ),
        Op::Random {
            y,
            dist,
            seed,
            offset,
        } => random::random(plan, par, y.layout.dtype, *dist, *seed, *offset),
        Op::Dropout {
            x, p, seed, offset, ..
        } => random::dropout(plan, par, x.layout.dtype, *p, *seed, *offset),
    })
}

/// Runs `$body` with `$E` the element type of the float dtype `$dtype`; `false` (no
/// fast path) for other dtypes.
macro_rules! with_float {
    ($dtype:expr, $E:ident => $body:expr) => {
        match $dtype {
            xpu_hal::DType::F32 => {
                type $E = f32;
                $body
            }
            xpu_hal::DType::F64 => {
                type $E = f64;
                $body
            }
            xpu_hal::DType::F16 => {
                type $E = xpu_hal::reference::f16;
                $body
            }
            xpu_hal::DType::BF16 => {
                type $E = xpu_hal::reference::bf16;
                $body
            }
            _ => false,
        }
    };
}
pub(super) use with_float;
