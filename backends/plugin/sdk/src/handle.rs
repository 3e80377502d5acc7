//! Handles: the plugin's objects behind the opaque pointers the host holds.
//!
//! Every object the host gets (`xpu_device*`, `xpu_stream*`, `xpu_buffer*`,
//! `xpu_event*`, `xpu_kernel*`) is a heap allocation made by the SDK around the
//! plugin's own value. Each starts with a tag naming its kind, so that a pointer of the
//! wrong kind (an event passed as a stream) is refused with `XPU_ERROR_INVALID_ARGUMENT`
//! instead of being misused. The tag is a debugging aid, not a guarantee: a dangling
//! or made-up pointer is still undefined behaviour, as in any C API.
//!
//! Devices and streams are boxed and owned by the host alone. Buffers, events and
//! kernels are reference-counted ([`Handle`]): the host holds one reference, and work a
//! stream has enqueued may hold more, so an event destroyed while a stream still waits
//! on it, or a buffer freed while a copy still reads it, stays alive until that work is
//! done. Each of these objects also records the device it belongs to, which lets the
//! SDK refuse a buffer of one device on a stream of another.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::error::{Error, Result};

/// The tag at the start of every handle object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Kind {
    Device = 0x7870_7564_6576_6963, // "xpudevic"
    Stream = 0x7870_7573_7472_6561, // "xpustrea"
    Buffer = 0x7870_7562_7566_6665, // "xpubuffe"
    Event = 0x7870_7565_7665_6e74,  // "xpuevent"
    Kernel = 0x7870_756b_6572_6e65, // "xpukerne"
    Group = 0x7870_7567_726f_7570,  // "xpugroup"
}

impl Kind {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Kind::Device => "device",
            Kind::Stream => "stream",
            Kind::Buffer => "buffer",
            Kind::Event => "event",
            Kind::Kernel => "kernel",
            Kind::Group => "group",
        }
    }

    /// The name with its indefinite article ("a stream", "an event").
    pub(crate) const fn with_article(self) -> &'static str {
        match self {
            Kind::Device => "a device",
            Kind::Stream => "a stream",
            Kind::Buffer => "a buffer",
            Kind::Event => "an event",
            Kind::Kernel => "a kernel",
            Kind::Group => "a group",
        }
    }
}

/// The identity of a device, recorded in every object made on it: the address of the
/// device's own handle object, which is unique while the device is open (and the host
/// destroys children before their device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceId(pub(crate) usize);

/// The shared object behind a [`Handle`]. `repr(C)` so that the tag is at offset 0 for
/// every `T` (and in [`Boxed`]), where a pointer of any kind can be checked.
#[repr(C)]
pub(crate) struct Shared<T> {
    kind: Kind,
    device: DeviceId,
    size: u64,
    value: T,
}

/// A reference to a buffer, event or kernel of the plugin: cheap to clone, dereferences
/// to the plugin's own value.
///
/// The host holds one reference through its opaque pointer and drops it with the
/// matching `free`/`destroy` call; a stream that keeps a clone (for work it has
/// enqueued) keeps the object alive until it drops the clone.
pub struct Handle<T>(Arc<Shared<T>>);

impl<T> Handle<T> {
    pub(crate) fn new(kind: Kind, device: DeviceId, size: u64, value: T) -> Self {
        Handle(Arc::new(Shared {
            kind,
            device,
            size,
            value,
        }))
    }

    /// Whether two handles are the same object.
    pub fn ptr_eq(a: &Handle<T>, b: &Handle<T>) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The object's address, for messages and identity maps.
    pub fn as_ptr(this: &Handle<T>) -> *const () {
        Arc::as_ptr(&this.0).cast()
    }

    /// The size in bytes the object was created with: a buffer's size, 0 otherwise.
    pub fn size(this: &Handle<T>) -> u64 {
        this.0.size
    }

    pub(crate) fn device(this: &Handle<T>) -> DeviceId {
        this.0.device
    }

    /// Gives the host its reference as an opaque pointer.
    pub(crate) fn into_raw<R>(this: Handle<T>) -> *mut R {
        Arc::into_raw(this.0).cast_mut().cast()
    }

    /// A new reference to the object behind a host pointer.
    ///
    /// # Safety
    /// `ptr` is null, or a pointer made by [`Handle::into_raw`] or [`Boxed::into_raw`]
    /// (of any kind and type) that has not been released.
    pub(crate) unsafe fn borrow<R>(
        ptr: *mut R,
        kind: Kind,
        what: impl fmt::Display,
    ) -> Result<Handle<T>> {
        // SAFETY: forwarded contract.
        unsafe { check_kind(ptr, kind, what) }?;
        let ptr = ptr.cast_const().cast::<Shared<T>>();
        // SAFETY: the tag says `ptr` came from `Arc::into_raw` of a `Shared<T>` of this
        // kind (the SDK makes one `T` per kind per plugin), and the host's reference is
        // alive, so the count is at least 1.
        unsafe { Arc::increment_strong_count(ptr) };
        // SAFETY: as above; this takes ownership of the count just added.
        Ok(Handle(unsafe { Arc::from_raw(ptr) }))
    }

    /// Takes back the host's reference (for `free`/`destroy`).
    ///
    /// # Safety
    /// As for [`Handle::borrow`]; the host's reference is released by this call, so the
    /// pointer must not be used again.
    pub(crate) unsafe fn take<R>(
        ptr: *mut R,
        kind: Kind,
        what: impl fmt::Display,
    ) -> Result<Handle<T>> {
        // SAFETY: forwarded contract.
        unsafe { check_kind(ptr, kind, what) }?;
        // SAFETY: as in `borrow`; this takes over the host's count.
        Ok(Handle(unsafe {
            Arc::from_raw(ptr.cast_const().cast::<Shared<T>>())
        }))
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        Handle(self.0.clone())
    }
}

impl<T> Deref for Handle<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0.value
    }
}

impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Handle<{}>({:p})",
            self.0.kind.name(),
            Arc::as_ptr(&self.0)
        )
    }
}

/// A device or stream object: owned by the host alone, through its opaque pointer.
#[repr(C)]
pub(crate) struct Boxed<T> {
    kind: Kind,
    pub(crate) device: DeviceId,
    pub(crate) value: T,
}

impl<T> Boxed<T> {
    /// Boxes `value` and gives the host the pointer. A device passes `None` and becomes
    /// its own [`DeviceId`].
    pub(crate) fn into_raw<R>(kind: Kind, device: Option<DeviceId>, value: T) -> *mut R {
        let raw = Box::into_raw(Box::new(Boxed {
            kind,
            device: device.unwrap_or(DeviceId(0)),
            value,
        }));
        if device.is_none() {
            // SAFETY: `raw` was just made from a box and is not shared yet.
            unsafe { (*raw).device = DeviceId(raw as usize) };
        }
        raw.cast()
    }

    /// The object behind a host pointer, borrowed for the call.
    ///
    /// # Safety
    /// As for [`Handle::borrow`]; the object is not destroyed during `'a` (the header
    /// never destroys an object concurrently with another call on it).
    pub(crate) unsafe fn borrow<'a, R>(
        ptr: *mut R,
        kind: Kind,
        what: impl fmt::Display,
    ) -> Result<&'a Self> {
        // SAFETY: forwarded contract.
        unsafe { check_kind(ptr, kind, what) }?;
        // SAFETY: the tag says this is a live `Boxed<T>` of this kind.
        Ok(unsafe { &*ptr.cast_const().cast::<Boxed<T>>() })
    }

    /// Takes back the object (for `close`/`destroy`).
    ///
    /// # Safety
    /// As for [`Boxed::borrow`]; the pointer must not be used again.
    pub(crate) unsafe fn take<R>(
        ptr: *mut R,
        kind: Kind,
        what: impl fmt::Display,
    ) -> Result<Box<Self>> {
        // SAFETY: forwarded contract.
        unsafe { check_kind(ptr, kind, what) }?;
        // SAFETY: the tag says this came from `Box::into_raw` in `into_raw`.
        Ok(unsafe { Box::from_raw(ptr.cast::<Boxed<T>>()) })
    }
}

/// Refuses a null pointer or one whose tag is not `kind`.
///
/// # Safety
/// `ptr` is null or points to a live handle object of this SDK (any kind).
unsafe fn check_kind<R>(ptr: *mut R, kind: Kind, what: impl fmt::Display) -> Result<()> {
    if ptr.is_null() {
        return Err(Error::invalid_argument(format!(
            "{what} is NULL; pass {} this plugin created",
            kind.with_article()
        )));
    }
    // SAFETY: every handle object is `repr(C)` with its `Kind` tag (a `u64`) at offset
    // 0; reading it as a plain integer accepts any value.
    let tag = unsafe { ptr.cast::<u64>().read() };
    if tag != kind as u64 {
        return Err(Error::invalid_argument(format!(
            "{what} ({ptr:p}) is not {} of this plugin; was another kind of object passed, or one already destroyed?",
            kind.with_article()
        )));
    }
    Ok(())
}
