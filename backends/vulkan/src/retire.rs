//! Deferred destruction of a dropped stream's synchronisation objects.
//!
//! A stream's completion thread learns that a batch is done when the batch signals the
//! stream's timeline semaphore. The driver may still be finishing that submission on its
//! own queue thread: Mesa's common queue code (lavapipe and others) releases the
//! submission's wait points — touching the semaphores it waited on, which may belong to
//! another stream — after the signal. Destroying such a semaphore as soon as its last
//! waiter's batch has signalled (when a stream is dropped right after the stream that
//! waited on it) crashed the driver's queue thread now and then.
//!
//! So a dropped stream's semaphores, command pool and query pool are *retired*: an empty
//! submission with a fence goes on every queue of the device, after everything submitted
//! so far, and the objects are destroyed once all those fences have signalled — a queue
//! finishes its submissions in order, so by then it has finished with every submission
//! that could refer to them. Nothing blocks: each retirement destroys what earlier ones
//! left once their fences have signalled, and the device destroys what is left when it
//! is dropped (after waiting for the device to be idle).

use std::sync::Mutex;

use ash::vk;

/// The objects of a dropped stream, waiting to be destroyed.
#[derive(Default)]
pub(crate) struct Retired {
    pub(crate) semaphores: Vec<vk::Semaphore>,
    pub(crate) command_pools: Vec<vk::CommandPool>,
    pub(crate) query_pools: Vec<vk::QueryPool>,
}

struct Entry {
    objects: Retired,
    /// Signalled after everything submitted before the retirement, one per queue.
    fences: Vec<vk::Fence>,
    /// Whether every queue got its fence; when not, the entry (fences included) waits
    /// for the device's own destruction.
    watched: bool,
}

/// What is retired and not yet destroyed, per device.
#[derive(Default)]
pub(crate) struct Graveyard {
    entries: Mutex<Vec<Entry>>,
}

use xpu_hal::backend::lock;

impl Graveyard {
    /// Retires `objects`, which nothing may use any more, and destroys those retired
    /// earlier whose queues have passed their retirement.
    pub(crate) fn retire(
        &self,
        device: &ash::Device,
        queues: &[Mutex<vk::Queue>],
        objects: Retired,
    ) {
        let (fences, watched) = fence_every_queue(device, queues);
        let mut entries = lock(&self.entries);
        entries.push(Entry {
            objects,
            fences,
            watched,
        });
        entries.retain_mut(|e| {
            if !e.watched {
                return true;
            }
            // SAFETY: fences of this device, not yet destroyed.
            let passed = e
                .fences
                .iter()
                .all(|f| matches!(unsafe { device.get_fence_status(*f) }, Ok(true)));
            if passed {
                // SAFETY: every queue has finished every submission made before the
                // objects were retired, and nothing made since refers to them.
                unsafe { destroy(device, e) };
            }
            !passed
        });
    }

    /// Destroys everything retired. Only when the device is idle.
    ///
    /// # Safety
    /// No submission that may refer to the retired objects is still executing.
    pub(crate) unsafe fn destroy_all(&self, device: &ash::Device) {
        for mut e in lock(&self.entries).drain(..) {
            // SAFETY: the caller's guarantee.
            unsafe { destroy(device, &mut e) };
        }
    }
}

/// An empty submission with a fence on each queue, and whether every queue got one
/// (the fences made before a failure are kept, to be destroyed with the entry).
fn fence_every_queue(device: &ash::Device, queues: &[Mutex<vk::Queue>]) -> (Vec<vk::Fence>, bool) {
    let mut fences = Vec::with_capacity(queues.len());
    for queue in queues {
        // SAFETY: a valid device and create info.
        let Ok(fence) = (unsafe { device.create_fence(&vk::FenceCreateInfo::default(), None) })
        else {
            return (fences, false);
        };
        let q = lock(queue);
        // SAFETY: the queue is externally synchronised by its mutex; an empty submission
        // with a fresh, unsignalled fence.
        let submitted = unsafe { device.queue_submit(*q, &[], fence) };
        drop(q);
        if submitted.is_err() {
            // SAFETY: the fence was not submitted.
            unsafe { device.destroy_fence(fence, None) };
            return (fences, false);
        }
        fences.push(fence);
    }
    (fences, true)
}

/// # Safety
/// Nothing uses the entry's objects any more.
unsafe fn destroy(device: &ash::Device, e: &mut Entry) {
    // SAFETY: the caller's guarantee; each handle is destroyed once (the lists are
    // drained).
    unsafe {
        for s in e.objects.semaphores.drain(..) {
            device.destroy_semaphore(s, None);
        }
        for p in e.objects.command_pools.drain(..) {
            device.destroy_command_pool(p, None);
        }
        for q in e.objects.query_pools.drain(..) {
            device.destroy_query_pool(q, None);
        }
        for f in e.fences.drain(..) {
            device.destroy_fence(f, None);
        }
    }
}
