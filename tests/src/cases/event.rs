//! Events: ordering between streams and between devices (of one backend or two),
//! completion queries, timeouts, timing, and errors carried by events.
//!
//! Where the device loads host functions, a gate kernel holds the first stream at a
//! known point, so "the waiting stream has not run yet" is checked without relying on
//! timing. On a device without them, a wait on a user event holds it instead (the
//! contract's own path for waits on what the device did not record), so every case
//! runs on a device alone. Failed work is made the same way: a failing kernel, or a
//! wait on a user event that is failed.

use std::time::{Duration, Instant};

use xpu_hal::{Device, Error, HostBuffer, UserEvent};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, enqueue_sleep, ensure, expect_invalid, expect_timeout, expect_unsupported,
    full_message, hold, inject_failure, pattern, upload, Hold,
};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "event.cross_stream",
        "a stream waiting on another stream's event runs its later work only after that event",
        cross_stream,
    ),
    Case::core(
        "event.cross_device",
        "a stream of another device (of this backend and of another backend) waiting on this device's event sees its results",
        cross_device,
    ),
    Case::core(
        "event.query_pending",
        "an event (and its stream) report not-done while the work before it is held, and done after",
        query_pending,
    ),
    Case::core(
        "event.wait_timeout",
        "waiting with a timeout on an unfinished event is a timeout error; after completion it succeeds",
        wait_timeout,
    ),
    Case::core(
        "event.elapsed",
        "elapsed time between two events of a stream is measured (or unsupported when the device does not time events)",
        elapsed,
    ),
    Case::core(
        "event.elapsed_cross_device",
        "elapsed time between events of two devices is an invalid-argument error",
        elapsed_cross_device,
    ),
    Case::core(
        "event.failed_work",
        "events recorded after failed work return its error; the stream works again once it reported it",
        failed_work,
    ),
    Case::core(
        "event.wait_on_failed",
        "a stream (of this or another device) waiting on an event of failed work reports an aborted error, then works again",
        wait_on_failed,
    ),
    Case::core(
        "event.user_event",
        "a stream waiting on a user event runs its later work only once it is completed; a failed one fails that work as aborted with its message, a dropped pending one fails it too, and the stream works again",
        user_event,
    ),
    Case::core(
        "event.self_wait",
        "a stream waiting on its own earlier event, or on a completed event, does not block",
        self_wait,
    ),
    Case::core(
        "event.completed_after_sync",
        "after synchronize every event recorded on the stream is complete",
        completed_after_sync,
    ),
];

/// How long the waiting stream's event is given to complete, wrongly, while the first
/// stream is held. A backend that honours the wait never completes it.
const HELD_PROBE: Duration = Duration::from_millis(30);

/// While the first stream is held, the waiting stream's event must not complete.
fn check_held(gate: &Hold, waiter: &xpu_hal::Event, what: &str) -> CaseOutcome {
    let result = waiter.wait_timeout(HELD_PROBE);
    gate.open();
    match result {
        Err(Error::Timeout { .. }) => Ok(()),
        Ok(()) => Err(CaseError::fail(format!(
            "{what}: the waiting stream finished its later work while the event it waits on was still held (by {}); the wait was not honoured",
            gate.how()
        ))),
        Err(e) => Err(e.into()),
    }
}

fn cross_stream(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(2)?;
    let a = ctx.device.create_stream()?;
    let b = ctx.device.create_stream()?;
    let data = pattern(0xE1, 4097);
    let x = upload(&ctx.device, &a, &vec![0; data.len()])?;
    let y = upload(&ctx.device, &b, &vec![0; data.len()])?;
    let host = HostBuffer::from_bytes(&data)?;
    let gate = hold(&a)?;
    a.copy_from_host(&host, 0, &x)?;
    let e = a.record_event()?;
    b.wait_event(&e)?;
    b.copy(&x, &y)?;
    let eb = b.record_event()?;
    check_held(&gate, &eb, "stream B waiting on stream A's event")?;
    b.synchronize()?;
    a.synchronize()?;
    check_bytes(
        &b.read(&y)?,
        &data,
        "what stream B copied after waiting on stream A's event recorded after A wrote it",
    )
}

fn cross_device_with(ctx: &CaseContext, peer: &Device) -> CaseOutcome {
    let a = ctx.device.create_stream()?;
    let b = peer.create_stream()?;
    let data = pattern(0xE2, 65_537);
    let x = upload(&ctx.device, &a, &data)?;
    let y = upload(peer, &b, &vec![0; data.len()])?;
    let host = HostBuffer::new(data.len())?;
    let gate = hold(&a)?;
    a.copy_to_host(&x, &host, 0)?;
    let e = a.record_event()?;
    b.wait_event(&e)?;
    b.copy_from_host(&host, 0, &y)?;
    let eb = b.record_event()?;
    check_held(
        &gate,
        &eb,
        &format!("{} waiting on an event of {}", peer.id(), ctx.device.id()),
    )?;
    b.synchronize()?;
    a.synchronize()?;
    check_bytes(
        &b.read(&y)?,
        &data,
        &format!(
            "data staged by {} and picked up by {} after waiting on its event",
            ctx.device.id(),
            peer.id()
        ),
    )
}

fn cross_device(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_peer()?;
    let backend = ctx.device.backend();
    let same = ctx.peers.iter().find(|p| p.backend() == backend);
    let other = ctx.peers.iter().find(|p| p.backend() != backend);
    for peer in same.into_iter().chain(other) {
        let kind = if peer.backend() == backend {
            "same backend"
        } else {
            "another backend"
        };
        cross_device_with(ctx, peer).map_err(|e| e.context(format!("{} ({kind})", peer.id())))?;
    }
    Ok(())
}

fn query_pending(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let gate = hold(&stream)?;
    let e = stream.record_event()?;
    ensure(e.device() == &ctx.device, || {
        "an event reports another device than its stream's".to_string()
    })?;
    let event_done = e.query()?;
    let stream_done = stream.query()?;
    gate.open();
    ensure(!event_done, || {
        format!(
            "an event reported complete while the stream before it was still held by {}",
            gate.how()
        )
    })?;
    ensure(!stream_done, || {
        format!(
            "a stream reported idle while it was still held by {}",
            gate.how()
        )
    })?;
    e.wait()?;
    ensure(e.query()?, || {
        "an event reported pending after wait returned".to_string()
    })?;
    stream.synchronize()?;
    ensure(stream.query()?, || {
        "a stream reported work pending after synchronize".to_string()
    })
}

fn wait_timeout(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let gate = hold(&stream)?;
    let e = stream.record_event()?;
    let start = Instant::now();
    let result = e.wait_timeout(Duration::from_millis(20));
    let waited = start.elapsed();
    gate.open();
    expect_timeout(
        result,
        &format!(
            "a 20 ms wait on an event behind a stream held by {}",
            gate.how()
        ),
    )?;
    ensure(waited >= Duration::from_millis(15), || {
        format!(
            "a 20 ms wait gave up after {:.1} ms",
            waited.as_secs_f64() * 1e3
        )
    })?;
    ensure(waited < Duration::from_secs(5), || {
        format!("a 20 ms wait took {:.1} s to give up", waited.as_secs_f64())
    })?;
    e.wait_timeout(Duration::from_secs(10))?;
    e.wait_timeout(Duration::ZERO)?;
    stream.synchronize()?;
    Ok(())
}

fn elapsed(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    // What lies between the two events takes a known minimum time.
    let start = Instant::now();
    let e1 = stream.record_event()?;
    let timed = if ctx.has_host_functions() {
        enqueue_sleep(&stream, 20)?;
        "a kernel that sleeps 20 ms"
    } else {
        // The first event completes before the wait starts.
        e1.wait()?;
        let gate = xpu_hal::UserEvent::new();
        stream.wait_user_event(&gate)?;
        std::thread::sleep(Duration::from_millis(20));
        gate.complete()?;
        "a wait on a user event completed 20 ms after the stream reached it"
    };
    let e2 = stream.record_event()?;
    e2.wait()?;
    let wall = start.elapsed();
    if !ctx.device.capabilities().event_timing {
        return expect_unsupported(
            e2.elapsed_since(&e1),
            "elapsed time on a device whose capabilities say it does not time events",
        );
    }
    let d = e2.elapsed_since(&e1)?;
    let bound = wall.mul_f64(1.1) + Duration::from_millis(2);
    ensure(d <= bound, || {
        format!(
            "elapsed time between two events is {:.3} ms, more than the {:.3} ms the host measured around them",
            d.as_secs_f64() * 1e3,
            wall.as_secs_f64() * 1e3
        )
    })?;
    ensure(d >= Duration::from_millis(15), || {
        format!(
            "elapsed time around {timed} is {:.3} ms",
            d.as_secs_f64() * 1e3
        )
    })?;
    let zero = e1.elapsed_since(&e1)?;
    ensure(zero <= Duration::from_millis(1), || {
        format!(
            "elapsed time from an event to itself is {:.3} ms, not 0",
            zero.as_secs_f64() * 1e3
        )
    })
}

fn elapsed_cross_device(ctx: &CaseContext) -> CaseOutcome {
    let peer = ctx.require_peer()?;
    let s = ctx.device.create_stream()?;
    let p = peer.create_stream()?;
    let local = s.record_event()?;
    let foreign = p.record_event()?;
    expect_invalid(
        foreign.elapsed_since(&local),
        &format!(
            "elapsed time from an event of {} to one of {}",
            ctx.device.id(),
            peer.id()
        ),
    )?;
    expect_invalid(
        local.elapsed_since(&foreign),
        &format!(
            "elapsed time from an event of {} to one of {}",
            peer.id(),
            ctx.device.id()
        ),
    )
}

const EVENT_FAILURE: &str = "conformance: deliberate failure before an event 0xe7e";

fn expect_failure_error(result: xpu_hal::Result<impl Sized>, what: &str) -> CaseOutcome {
    match result {
        Ok(_) => Err(CaseError::fail(format!(
            "{what} succeeded; it must return the error of the failed kernel before it"
        ))),
        Err(e) => ensure(full_message(&e).contains(EVENT_FAILURE), || {
            format!(
                "{what} returned a {} error without the failed kernel's message `{EVENT_FAILURE}`: {}",
                e.kind(),
                full_message(&e)
            )
        }),
    }
}

fn failed_work(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let data = pattern(0xE7, 333);
    let src = upload(&ctx.device, &stream, &data)?;
    let dst = ctx.device.allocate(333)?;
    let failure = inject_failure(&stream, EVENT_FAILURE)?;
    let failed = &failure.what;
    let e1 = stream.record_event()?;
    stream.copy(&src, &dst)?;
    let e2 = stream.record_event()?;
    expect_failure_error(
        e1.wait(),
        &format!("waiting on an event recorded right after {failed}"),
    )?;
    expect_failure_error(
        e1.query(),
        &format!("querying an event recorded after {failed}"),
    )?;
    expect_failure_error(
        e2.wait(),
        &format!("waiting on an event recorded after {failed} and a later copy"),
    )?;
    expect_failure_error(
        stream.synchronize(),
        &format!("synchronizing the stream of {failed} (events do not consume its report)"),
    )?;
    stream.copy(&src, &dst)?;
    let e3 = stream.record_event()?;
    e3.wait().map_err(|e| {
        CaseError::fail(format!(
            "an event recorded after the stream reported its failure returned an error: {e}"
        ))
    })?;
    check_bytes(
        &stream.read(&dst)?,
        &data,
        "a copy made after the stream reported its failure",
    )
}

/// The message a case fails a user event with.
const USER_FAILURE: &str = "conformance: a user event failed on purpose 0xe9e";

/// `result` must be an aborted error, whose message contains `needle` when given.
fn expect_aborted(result: xpu_hal::Result<()>, needle: Option<&str>, what: &str) -> CaseOutcome {
    match result {
        Err(e @ Error::Aborted { .. }) => {
            let message = full_message(&e);
            ensure(needle.is_none_or(|n| message.contains(n)), || {
                format!("{what}: the aborted error does not carry the user event's message `{}`: {message}", needle.unwrap_or_default())
            })
        }
        Err(other) => Err(CaseError::fail(format!(
            "{what}: a {} error ({other}); work that did not run because a waited-on event failed is aborted",
            other.kind()
        ))),
        Ok(()) => Err(CaseError::fail(format!(
            "{what}: no error; the work after the wait must fail as aborted"
        ))),
    }
}

fn user_event(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let data = pattern(0xE9, 4097);
    let src = upload(&ctx.device, &stream, &data)?;
    let dst = upload(&ctx.device, &stream, &vec![0; data.len()])?;
    // Completed: the later work waits for it.
    let gate = UserEvent::new();
    stream.wait_user_event(&gate)?;
    stream.copy(&src, &dst)?;
    let e = stream.record_event()?;
    match e.wait_timeout(HELD_PROBE) {
        Err(Error::Timeout { .. }) => {}
        Ok(()) => {
            return Err(CaseError::fail(
                "work enqueued after a wait on a pending user event finished before the event was completed; the wait was not honoured",
            ))
        }
        Err(e) => return Err(e.into()),
    }
    ensure(!stream.query()?, || {
        "the stream reports its work done while it waits on a pending user event".to_string()
    })?;
    gate.complete()?;
    e.wait_timeout(Duration::from_secs(30)).map_err(|e| {
        CaseError::fail(format!(
            "work after a wait on a user event did not finish once the event was completed: {e}"
        ))
    })?;
    check_bytes(
        &stream.read(&dst)?,
        &data,
        "a copy enqueued after a wait on a user event, once the event was completed",
    )?;
    // A wait on a completed user event does not block.
    stream.wait_user_event(&gate)?;
    stream.synchronize()?;
    // Failed: the later work fails with its message, once, and the stream goes on.
    let gate = UserEvent::new();
    stream.wait_user_event(&gate)?;
    stream.copy(&src, &dst)?;
    gate.fail(USER_FAILURE)?;
    expect_aborted(
        stream.synchronize(),
        Some(USER_FAILURE),
        "synchronizing a stream that waited on a failed user event",
    )?;
    stream.copy(&dst, &src)?;
    stream.synchronize().map_err(|e| {
        CaseError::fail(format!(
            "the stream failed again after it reported the failed user event: {e}"
        ))
    })?;
    // Dropped pending: nothing could complete it, so its waiters fail.
    let gate = UserEvent::new();
    stream.wait_user_event(&gate)?;
    stream.copy(&src, &dst)?;
    drop(gate);
    expect_aborted(
        stream.synchronize(),
        None,
        "synchronizing a stream that waited on a user event dropped before it was completed",
    )?;
    stream.synchronize().map_err(|e| {
        CaseError::fail(format!(
            "the stream failed again after it reported the dropped user event: {e}"
        ))
    })
}

fn wait_on_failed(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(2)?;
    let a = ctx.device.create_stream()?;
    let mut waiters = vec![(ctx.device.clone(), ctx.device.create_stream()?)];
    if let Some(peer) = ctx.peers.first() {
        waiters.push((peer.clone(), peer.create_stream()?));
    }
    let failure = inject_failure(&a, EVENT_FAILURE)?;
    let e = a.record_event()?;
    for (device, b) in &waiters {
        let what = format!(
            "a stream of {} waiting on an event of {} recorded after {}",
            device.id(),
            ctx.device.id(),
            failure.what
        );
        let data = pattern(0xEA, 100);
        let src = upload(device, b, &data)?;
        let dst = device.allocate(100)?;
        b.wait_event(&e)?;
        b.copy(&src, &dst)?;
        match b.synchronize() {
            Err(Error::Aborted { .. }) => {}
            Err(other) => {
                return Err(CaseError::fail(format!(
                    "{what} reported a {} error ({other}); work that did not run because a waited-on event failed is aborted",
                    other.kind()
                )))
            }
            Ok(()) => {
                return Err(CaseError::fail(format!(
                    "{what} synchronized without an error; it must report the failure as aborted"
                )))
            }
        }
        b.copy(&src, &dst)?;
        b.synchronize()?;
        check_bytes(
            &b.read(&dst)?,
            &data,
            &format!("{what}: a copy after the failure was reported"),
        )?;
    }
    expect_failure_error(
        a.synchronize(),
        &format!("synchronizing the stream of {}", failure.what),
    )
}

fn self_wait(ctx: &CaseContext) -> CaseOutcome {
    ctx.require_streams(2)?;
    let stream = ctx.device.create_stream()?;
    let other = ctx.device.create_stream()?;
    let data = pattern(0xE8, 1000);
    let src = upload(&ctx.device, &stream, &data)?;
    let dst = ctx.device.allocate(1000)?;
    let e = stream.record_event()?;
    stream.wait_event(&e)?;
    stream.wait_event(&e)?;
    stream.copy(&src, &dst)?;
    stream.synchronize()?;
    check_bytes(
        &stream.read(&dst)?,
        &data,
        "a copy queued after the stream waited on its own earlier event",
    )?;
    // A completed event from another stream, waited on twice.
    let done = stream.record_event()?;
    done.wait()?;
    other.wait_event(&done)?;
    other.wait_event(&done)?;
    let dst2 = ctx.device.allocate(1000)?;
    other.copy(&src, &dst2)?;
    other.synchronize()?;
    check_bytes(
        &other.read(&dst2)?,
        &data,
        "a copy queued after waiting twice on a completed event",
    )
}

fn completed_after_sync(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let data = pattern(0xE9, 2048);
    let src = upload(&ctx.device, &stream, &data)?;
    let a = ctx.device.allocate(2048)?;
    let b = ctx.device.allocate(2048)?;
    let e1 = stream.record_event()?;
    stream.copy(&src, &a)?;
    let e2 = stream.record_event()?;
    stream.copy(&a, &b)?;
    let e3 = stream.record_event()?;
    stream.synchronize()?;
    for (i, e) in [e1, e2, e3].iter().enumerate() {
        ensure(e.query()?, || {
            format!("event {} of 3 reports pending after synchronize", i + 1)
        })?;
        e.wait()?;
        e.wait_timeout(Duration::ZERO)?;
    }
    check_bytes(&stream.read(&b)?, &data, "two chained copies")
}
