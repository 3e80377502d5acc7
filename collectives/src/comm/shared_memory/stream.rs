//! Copies with streaming (non-temporal) stores, which write whole cache lines to memory
//! without reading them first. Only x86-64 has them here; elsewhere these are plain
//! copies.

/// Copies `len` bytes from `from` to `to` (disjoint), streaming the stores where the
/// architecture can. Call [`fence`] before other threads may read the destination.
///
/// # Safety
///
/// `from` must be valid for reading and `to` for writing `len` bytes, and the two ranges
/// must not overlap.
pub(super) unsafe fn copy(from: *const u8, to: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        // Plain bytes up to the first 16-byte boundary of the destination.
        let head = to.align_offset(16).min(len);
        // SAFETY: within both ranges (the caller's contract); the ranges are disjoint.
        unsafe { std::ptr::copy_nonoverlapping(from, to, head) };
        let mut at = head;
        while at + 16 <= len {
            // SAFETY: 16 bytes at `at` lie within both ranges; the destination is
            // 16-byte aligned here (SSE2 is part of x86-64, so the intrinsics exist).
            unsafe {
                let v = _mm_loadu_si128(from.add(at).cast::<__m128i>());
                _mm_stream_si128(to.add(at).cast::<__m128i>(), v);
            }
            at += 16;
        }
        // SAFETY: the remaining tail lies within both ranges.
        unsafe { std::ptr::copy_nonoverlapping(from.add(at), to.add(at), len - at) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(from, to, len)
    };
}

/// Orders streaming stores before the stores that follow (the share's completion count),
/// so other threads that see those see these.
pub(super) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64; a fence has no other requirement.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}
