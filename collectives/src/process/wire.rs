//! The header before every message between processes: which operation it belongs to,
//! so that processes that disagree are told so instead of exchanging the wrong bytes.

use xpu_hal::DType;

use crate::comm::op::{Collective, OpDesc, ReduceOp};

/// Marks a header of this format.
const MAGIC: u64 = u64::from_le_bytes(*b"xpu-op01");

/// Words in a header.
pub(crate) const WORDS: usize = 8;

/// A header's bytes.
pub(crate) type Header = [u64; WORDS];

/// The header of operation `seq` (`desc`, with global ranks), sent by process `from`.
pub(crate) fn encode(seq: u64, desc: &OpDesc, from: usize) -> Header {
    let index = |found: Option<usize>| found.map_or(0, |i| i as u64 + 1);
    [
        MAGIC,
        seq,
        index(Collective::ALL.iter().position(|k| *k == desc.kind)),
        desc.bytes,
        index(
            desc.dtype
                .and_then(|d| DType::ALL.iter().position(|x| *x == d)),
        ),
        index(
            desc.op
                .and_then(|o| ReduceOp::ALL.iter().position(|x| *x == o)),
        ),
        desc.root.map_or(0, |r| r as u64 + 1),
        from as u64,
    ]
}

/// What a received header says: the operation's number and description, or `None`
/// when the bytes are not a header of this format.
pub(crate) fn decode(h: &Header) -> Option<(u64, OpDesc)> {
    if h[0] != MAGIC {
        return None;
    }
    fn pick<T: Copy>(all: &[T], code: u64) -> Option<Option<T>> {
        match code {
            0 => Some(None),
            c => all.get(usize::try_from(c - 1).ok()?).copied().map(Some),
        }
    }
    let kind = pick(&Collective::ALL, h[2])??;
    Some((
        h[1],
        OpDesc {
            kind,
            bytes: h[3],
            dtype: pick(&DType::ALL, h[4])?,
            op: pick(&ReduceOp::ALL, h[5])?,
            root: match h[6] {
                0 => None,
                r => Some(usize::try_from(r - 1).ok()?),
            },
        },
    ))
}

/// The bytes of a header.
pub(crate) fn bytes(h: &Header) -> &[u8] {
    bytemuck::cast_slice(h)
}

/// The bytes of a header, to receive into.
pub(crate) fn bytes_mut(h: &mut Header) -> &mut [u8] {
    bytemuck::cast_slice_mut(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_description_survives_the_wire() {
        for kind in Collective::ALL {
            for dtype in [None, Some(DType::BF16), Some(DType::I64)] {
                for op in [None, Some(ReduceOp::Avg), Some(ReduceOp::Sum)] {
                    for root in [None, Some(0), Some(7)] {
                        let desc = OpDesc {
                            kind,
                            bytes: 4096,
                            dtype,
                            op,
                            root,
                        };
                        let h = encode(42, &desc, 3);
                        assert_eq!(decode(&h), Some((42, desc)));
                    }
                }
            }
        }
    }

    #[test]
    fn bytes_of_another_format_are_no_header() {
        let desc = OpDesc {
            kind: Collective::Barrier,
            bytes: 0,
            dtype: None,
            op: None,
            root: None,
        };
        let mut h = encode(1, &desc, 0);
        h[0] ^= 1;
        assert_eq!(decode(&h), None);
        let mut h = encode(1, &desc, 0);
        h[2] = 99;
        assert_eq!(decode(&h), None);
    }
}
