//! Device memory: one arena per device, carved into buffers by a first-fit allocator.
//!
//! The arena is a single zero-filled block of the configured size, reserved when the
//! device is opened (the operating system commits its pages only as they are touched).
//! Buffers are ranges of it, aligned to [`ALIGN`] bytes; freeing one returns its range
//! and merges it with free neighbours. So out-of-memory happens as on a real device —
//! including through fragmentation — without exhausting the machine, and a freed
//! buffer's bytes show up again in a later allocation (device memory is not cleared).
//!
//! Invariants kept by [`FreeList`]: free ranges are disjoint, never adjacent (merged),
//! aligned, and together with the live buffers cover the arena exactly.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use xpu_plugin_sdk::{Error, Result};

/// Alignment of every buffer, in bytes.
pub const ALIGN: u64 = 256;

/// The free ranges of an arena: offset → length.
#[derive(Debug)]
struct FreeList {
    ranges: BTreeMap<u64, u64>,
    free: u64,
}

impl FreeList {
    fn new(capacity: u64) -> Self {
        let usable = capacity - capacity % ALIGN;
        let mut ranges = BTreeMap::new();
        if usable > 0 {
            ranges.insert(0, usable);
        }
        FreeList {
            ranges,
            free: usable,
        }
    }

    /// The first free range that holds `size` bytes; takes them from its start.
    fn take(&mut self, size: u64) -> Option<u64> {
        let (&offset, &len) = self.ranges.iter().find(|(_, &len)| len >= size)?;
        self.ranges.remove(&offset);
        if len > size {
            self.ranges.insert(offset + size, len - size);
        }
        self.free -= size;
        Some(offset)
    }

    /// Returns `[offset, offset + size)`, merging it with free neighbours.
    fn give(&mut self, offset: u64, size: u64) {
        let (mut start, mut len) = (offset, size);
        if let Some((&prev, &prev_len)) = self.ranges.range(..offset).next_back() {
            if prev + prev_len == offset {
                self.ranges.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.ranges.remove(&(offset + size)) {
            len += next_len;
        }
        self.ranges.insert(start, len);
        self.free += size;
    }

    fn largest(&self) -> u64 {
        self.ranges.values().copied().max().unwrap_or(0)
    }
}

/// One device's memory.
pub(crate) struct Arena {
    /// The allocation as made (for `dealloc`).
    block: NonNull<u8>,
    /// The first [`ALIGN`]-aligned byte of it: offset 0 of the arena.
    base: *mut u8,
    layout: Layout,
    capacity: u64,
    free: Mutex<FreeList>,
    device: String,
}

// SAFETY: the arena owns its block (like a `Box<[u8]>`); the free list is behind a
// mutex; the bytes are only touched through `Buffer::ptr` by stream workers, which the
// host orders with events like accesses to any device memory.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// Reserves `capacity` bytes for device `device`.
    ///
    /// The block is allocated with the allocator's natural alignment and aligned by
    /// hand: Rust's `alloc_zeroed` serves small alignments with `calloc`, whose pages
    /// the operating system zeroes lazily, but larger ones by writing zeros over the
    /// whole block, which would touch every byte of every device at open.
    pub(crate) fn new(device: String, capacity: u64) -> Result<Arc<Arena>> {
        let layout = usize::try_from(capacity)
            .ok()
            .and_then(|c| c.checked_add(ALIGN as usize))
            .and_then(|size| Layout::from_size_align(size, 16).ok())
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{device}: {capacity} bytes of memory do not fit this process's address space; lower XPU_SIMNPU_MEMORY"
                ))
            })?;
        // SAFETY: `layout` has a nonzero size (at least ALIGN).
        let block = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).ok_or_else(|| {
            Error::out_of_memory(format!(
                "{device}: the host could not reserve the device's {capacity} bytes of memory; lower XPU_SIMNPU_MEMORY"
            ))
        })?;
        let skip = block.as_ptr().align_offset(ALIGN as usize);
        // `skip < ALIGN`, and the block holds `capacity + ALIGN` bytes.
        let base = block.as_ptr().wrapping_add(skip);
        Ok(Arc::new(Arena {
            block,
            base,
            layout,
            capacity,
            free: Mutex::new(FreeList::new(capacity)),
            device,
        }))
    }

    fn list(&self) -> MutexGuard<'_, FreeList> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The arena's size in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes not held by any buffer.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.list().free
    }

    /// A buffer of `size` bytes (1 or more).
    pub(crate) fn allocate(self: &Arc<Self>, size: u64) -> Result<Buffer> {
        let reserved = size
            .checked_next_multiple_of(ALIGN)
            .unwrap_or(u64::MAX)
            .max(ALIGN);
        let mut list = self.list();
        match list.take(reserved) {
            Some(offset) => Ok(Buffer {
                arena: self.clone(),
                offset,
                size,
                reserved,
            }),
            None => Err(Error::out_of_memory(format!(
                "{} cannot allocate {size} bytes: {} of {} bytes are free, the largest free block holds {}; free buffers you no longer need, or raise XPU_SIMNPU_MEMORY",
                self.device,
                list.free,
                self.capacity,
                list.largest()
            ))),
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `block` came from `alloc_zeroed` with this layout; every buffer holds
        // an `Arc` of the arena, so none is left.
        unsafe { std::alloc::dealloc(self.block.as_ptr(), self.layout) };
    }
}

/// A buffer: a range of its device's arena, returned when the buffer is dropped.
pub struct Buffer {
    arena: Arc<Arena>,
    offset: u64,
    size: u64,
    reserved: u64,
}

impl Buffer {
    /// The requested size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The address of byte `at` of the buffer.
    ///
    /// Guaranteed to be in bounds (and aligned as the arena's [`ALIGN`] allows) when
    /// `at <= size`, which the SDK checks for every range it hands over.
    pub(crate) fn ptr(&self, at: u64) -> *mut u8 {
        let at = at.min(self.reserved);
        // `offset + reserved <= capacity`, which fits `usize` (checked in `Arena::new`).
        self.arena.base.wrapping_add((self.offset + at) as usize)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.arena.list().give(self.offset, self.reserved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_first_fit_and_frees_merge() {
        let arena = Arena::new("t".into(), 4 * ALIGN).unwrap();
        let a = arena.allocate(1).unwrap();
        let b = arena.allocate(ALIGN + 1).unwrap();
        let c = arena.allocate(ALIGN).unwrap();
        assert_eq!((a.offset, b.offset, c.offset), (0, ALIGN, 3 * ALIGN));
        assert_eq!(arena.free_bytes(), 0);
        let e = arena.allocate(1).map(|_| ()).unwrap_err();
        assert_eq!(e.code(), xpu_plugin_sdk::ErrorCode::OutOfMemory);
        drop(a);
        drop(c);
        // Fragmented: 2 blocks free but not adjacent.
        assert_eq!(arena.free_bytes(), 2 * ALIGN);
        let e = arena.allocate(2 * ALIGN).map(|_| ()).unwrap_err();
        assert!(
            e.message().contains("the largest free block holds 256"),
            "{e}"
        );
        drop(b);
        assert_eq!(arena.list().ranges.len(), 1);
        let whole = arena.allocate(4 * ALIGN).unwrap();
        assert_eq!(whole.offset, 0);
    }

    #[test]
    fn buffers_keep_the_arena_alive_and_are_aligned() {
        let arena = Arena::new("t".into(), 1 << 20).unwrap();
        let b = arena.allocate(100).unwrap();
        drop(arena);
        assert_eq!(b.ptr(0) as usize % ALIGN as usize, 0);
        // SAFETY: byte 99 of a live 100-byte buffer.
        unsafe { b.ptr(99).write(7) };
        assert_eq!(b.size(), 100);
    }
}
