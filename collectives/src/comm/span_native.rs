//! Operations of a communicator across processes that go to the devices' own library
//! spanning the processes (`native_across.rs`): each rank checks its arguments against
//! the whole communicator, then its part joins its process's others in one call to the
//! library's group.

use xpu_hal::group::GroupOp;

use super::algorithms::group_reduce;
use super::args::{check_aliasing, check_all_reduce, check_dtype, check_len, check_slice, Range};
use super::native_across::NativeAcross;
use super::span::Span;
use super::*;

/// One operation as the public call gave it, global ranks and lengths.
pub(super) enum Call<'a> {
    AllReduce {
        send: BufferSlice<'a>,
        recv: BufferSlice<'a>,
        dtype: DType,
        op: ReduceOp,
    },
    Reduce {
        send: BufferSlice<'a>,
        recv: Option<BufferSlice<'a>>,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    },
    Broadcast {
        send: Option<BufferSlice<'a>>,
        recv: BufferSlice<'a>,
        root: usize,
    },
    AllGather {
        send: BufferSlice<'a>,
        recv: BufferSlice<'a>,
    },
    ReduceScatter {
        send: BufferSlice<'a>,
        recv: BufferSlice<'a>,
        dtype: DType,
        op: ReduceOp,
    },
    AllToAll {
        send: BufferSlice<'a>,
        recv: BufferSlice<'a>,
    },
}

impl Call<'_> {
    fn kind(&self) -> Collective {
        match self {
            Call::AllReduce { .. } => Collective::AllReduce,
            Call::Reduce { .. } => Collective::Reduce,
            Call::Broadcast { .. } => Collective::Broadcast,
            Call::AllGather { .. } => Collective::AllGather,
            Call::ReduceScatter { .. } => Collective::ReduceScatter,
            Call::AllToAll { .. } => Collective::AllToAll,
        }
    }

    /// Bytes per rank, as the cost model counts them.
    fn bytes(&self, size: usize) -> u64 {
        match self {
            Call::AllReduce { recv, .. } | Call::Broadcast { recv, .. } => recv.len,
            Call::Reduce { send, .. } | Call::AllGather { send, .. } => send.len,
            Call::ReduceScatter { recv, .. } => recv.len,
            Call::AllToAll { send, .. } => send.len / size.max(1) as u64,
        }
    }
}

fn count(bytes: u64, dtype: DType) -> Result<usize> {
    usize::try_from(bytes / dtype.size() as u64)
        .map_err(|_| Error::invalid("the operation does not fit this platform's sizes"))
}

fn bytes(n: u64) -> Result<usize> {
    usize::try_from(n)
        .map_err(|_| Error::invalid("the operation does not fit this platform's sizes"))
}

impl Rank {
    /// The library across processes, when the communicator has one and it is chosen
    /// for `call`.
    fn native_for<'s>(&self, span: &'s Span, call: &Call<'_>) -> Option<&'s NativeAcross> {
        let native = span.native.as_ref()?;
        let kind = call.kind();
        let bytes = call.bytes(span.size);
        let forced = self.shared.options.selector.forced(kind, bytes);
        let firsts: Vec<usize> = span.procs.iter().map(|p| p.first_rank).collect();
        let topology = span.topology.lock().unwrap_or_else(|p| p.into_inner());
        native
            .chosen(kind, bytes, span.size, forced, &topology, &firsts)
            .then_some(native)
    }

    /// Runs operation `seq` through the library across processes when it is chosen
    /// (`None` otherwise: the caller runs its own steps).
    pub(super) fn span_native(
        &self,
        span: &Span,
        seq: u64,
        call: Call<'_>,
        stream: &Stream,
    ) -> Option<Result<()>> {
        let native = self.native_for(span, &call)?;
        Some(self.native_call(span, native, seq, call, stream))
    }

    fn native_call(
        &self,
        span: &Span,
        native: &NativeAcross,
        seq: u64,
        call: Call<'_>,
        stream: &Stream,
    ) -> Result<()> {
        let refuse = |e: Error| {
            // The other processes' parts are in the library already: abort it, so that
            // they fail instead of waiting for this process's.
            native.abort();
            self.failed_here(span, e)
        };
        {
            let st = self.shared.lock();
            self.shared.check_failed(&st)?;
        }
        let (op, send, recv) = self.native_args(span, call).map_err(refuse)?;
        native
            .run(self.rank, seq, op, stream, send, recv, span.timeout)
            .map_err(refuse)
    }

    /// The library's operation and this rank's ranges, checked against the whole
    /// communicator.
    fn native_args<'a>(
        &self,
        span: &Span,
        call: Call<'a>,
    ) -> Result<(GroupOp, Option<BufferSlice<'a>>, Option<BufferSlice<'a>>)> {
        let device = self.device();
        let n = span.size as u64;
        let me = self.rank();
        let check_root = |root: usize| {
            if root >= span.size {
                return Err(Error::invalid(format!(
                    "root {root} is not a rank; the communicator has {} ranks",
                    span.size
                )));
            }
            Ok(root)
        };
        Ok(match call {
            Call::AllReduce {
                send,
                recv,
                dtype,
                op,
            } => {
                let (s, r) = check_all_reduce(device, &send, &recv, dtype)?;
                let op = GroupOp::AllReduce {
                    count: count(r.len, dtype)?,
                    dtype,
                    op: group_reduce(op),
                };
                (op, Some(s), Some(r))
            }
            Call::Reduce {
                send,
                recv,
                dtype,
                op,
                root,
            } => {
                let root = check_root(root)?;
                let s = check_slice(device, &send, "send buffer")?;
                check_dtype(device, s.len, dtype, "send buffer")?;
                let r = if me == root {
                    let r = recv.ok_or_else(|| {
                        Error::invalid("the root of a reduce needs a receive buffer")
                    })?;
                    let r = check_slice(device, &r, "receive buffer")?;
                    check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
                    check_aliasing(&s, &r)?;
                    Some(r)
                } else {
                    None
                };
                let op = GroupOp::Reduce {
                    count: count(s.len, dtype)?,
                    dtype,
                    op: group_reduce(op),
                    root,
                };
                (op, Some(s), r)
            }
            Call::Broadcast { send, recv, root } => {
                let root = check_root(root)?;
                let r = check_slice(device, &recv, "receive buffer")?;
                let s = match send.filter(|_| me == root) {
                    Some(s) => {
                        let s = check_slice(device, &s, "send buffer")?;
                        check_len(s.len, r.len, "send buffer (the receive buffer's length)")?;
                        check_aliasing(&s, &r)?;
                        Some(s)
                    }
                    None => None,
                };
                let op = GroupOp::Broadcast {
                    bytes: bytes(r.len)?,
                    root,
                };
                (op, s, Some(r))
            }
            Call::AllGather { send, recv } => {
                let s = check_slice(device, &send, "send buffer")?;
                let r = check_slice(device, &recv, "receive buffer")?;
                check_len(r.len, s.len * n, "receive buffer (ranks × the send buffer)")?;
                if !s.same_as(&r.sub(me as u64 * s.len, s.len)) {
                    check_aliasing(&s, &r)?;
                }
                let op = GroupOp::AllGather {
                    bytes: bytes(s.len)?,
                };
                (op, Some(s), Some(r))
            }
            Call::ReduceScatter {
                send,
                recv,
                dtype,
                op,
            } => {
                let s = check_slice(device, &send, "send buffer")?;
                let r = check_slice(device, &recv, "receive buffer")?;
                check_len(s.len, r.len * n, "send buffer (ranks × the receive buffer)")?;
                check_dtype(device, r.len, dtype, "receive buffer")?;
                if !r.same_as(&s.sub(me as u64 * r.len, r.len)) {
                    check_aliasing(&s, &r)?;
                }
                let op = GroupOp::ReduceScatter {
                    count: count(r.len, dtype)?,
                    dtype,
                    op: group_reduce(op),
                };
                (op, Some(s), Some(r))
            }
            Call::AllToAll { send, recv } => {
                let s = check_slice(device, &send, "send buffer")?;
                let r = check_slice(device, &recv, "receive buffer")?;
                check_len(r.len, s.len, "receive buffer (the send buffer's length)")?;
                if !s.len.is_multiple_of(n) {
                    return Err(Error::invalid(format!(
                        "the send buffer is {} bytes, not {n} equal blocks",
                        s.len
                    )));
                }
                check_aliasing(&s, &r)?;
                let op = GroupOp::AllToAll {
                    bytes: bytes(s.len / n)?,
                };
                (op, Some(s), Some(r))
            }
        })
    }
}
