//! Copies host→device, device→host and device→device at odd offsets and sizes,
//! verified byte for byte, and the copies the HAL must refuse.

use xpu_hal::{HostBuffer, HostMemory};

use crate::case::{Case, CaseContext, CaseError, CaseOutcome};
use crate::cases::util::{
    check_bytes, ensure, expect_invalid, expect_unsupported, hold, pattern, upload, MIB,
};

pub(crate) const CASES: &[Case] = &[
    Case::core(
        "copy.roundtrip",
        "host→device→host round trips of 1, 3, 4097 and 1 MiB + 13 bytes return the data",
        roundtrip,
    ),
    Case::core(
        "copy.h2d_offsets",
        "host→device copies at odd host and device offsets land exactly and touch no neighbour",
        h2d_offsets,
    ),
    Case::core(
        "copy.d2h_offsets",
        "device→host copies at odd offsets land exactly and touch no neighbouring host byte",
        d2h_offsets,
    ),
    Case::core(
        "copy.d2d_offsets",
        "device→device copies between and within allocations at odd offsets land exactly",
        d2d_offsets,
    ),
    Case::core(
        "copy.pinned",
        "host buffers pinned for the device take copies both ways at odd offsets behind held work exactly, stay valid when dropped with copies in flight, and pin once: asking again gives the same answer; buffers under a page are never pinned",
        pinned,
    ),
    Case::core(
        "copy.len_mismatch",
        "copies whose source and destination lengths differ are invalid-argument errors",
        len_mismatch,
    ),
    Case::core(
        "copy.overlap",
        "device copies between overlapping ranges are invalid-argument errors",
        overlap,
    ),
    Case::core(
        "copy.out_of_bounds",
        "device ranges past the end of an allocation (or overflowing u64) are invalid-argument errors",
        out_of_bounds,
    ),
    Case::core(
        "copy.host_out_of_bounds",
        "host ranges past the end of the host buffer are invalid-argument errors",
        host_out_of_bounds,
    ),
    Case::core(
        "copy.peer",
        "peer copies from another device of the backend land exactly where peer_access is declared, are refused with unsupported where it is not, and are refused across backends",
        peer,
    ),
];

const SIZES: [usize; 4] = [1, 3, 4097, MIB as usize + 13];

fn roundtrip(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for (i, &size) in SIZES.iter().enumerate() {
        let data = pattern(i as u64 + 1, size);
        let src = HostBuffer::from_bytes(&data)?;
        let mut dst = HostBuffer::new(size)?;
        let dev = ctx.device.allocate(size as u64)?;
        // Both copies queued back to back: the stream's order makes the second see the
        // first's result.
        stream.copy_from_host(&src, 0, &dev)?;
        stream.copy_to_host(&dev, &dst, 0)?;
        stream.synchronize()?;
        check_bytes(dst.as_slice()?, &data, &format!("{size}-byte round trip"))?;
    }
    Ok(())
}

/// (host offset, device offset, length, allocation size)
const PLACEMENTS: [(usize, u64, usize, u64); 5] = [
    (0, 0, 1, 16),
    (1, 3, 3, 16),
    (7, 13, 4097, 8192),
    (5, 1, MIB as usize + 13, MIB + 64),
    (0, 4095, 2, 8192),
];

fn h2d_offsets(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for (i, &(host_off, dev_off, len, alloc)) in PLACEMENTS.iter().enumerate() {
        let background = pattern(50 + i as u64, alloc as usize);
        let dev = upload(&ctx.device, &stream, &background)?;
        let host_data = pattern(60 + i as u64, host_off + len + 9);
        let host = HostBuffer::from_bytes(&host_data)?;
        stream.copy_from_host(&host, host_off as u64, dev.slice(dev_off, len as u64))?;
        let got = stream.read(&dev)?;
        let mut want = background;
        let d = dev_off as usize;
        want[d..d + len].copy_from_slice(&host_data[host_off..host_off + len]);
        check_bytes(
            &got,
            &want,
            &format!(
                "{len} bytes from host offset {host_off} to device offset {dev_off} of a {alloc}-byte allocation"
            ),
        )?;
    }
    Ok(())
}

fn d2h_offsets(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    for (i, &(host_off, dev_off, len, alloc)) in PLACEMENTS.iter().enumerate() {
        let dev_data = pattern(70 + i as u64, alloc as usize);
        let dev = upload(&ctx.device, &stream, &dev_data)?;
        let background = pattern(80 + i as u64, host_off + len + 9);
        let mut host = HostBuffer::from_bytes(&background)?;
        stream.copy_to_host(dev.slice(dev_off, len as u64), &host, host_off as u64)?;
        stream.synchronize()?;
        let mut want = background;
        let d = dev_off as usize;
        want[host_off..host_off + len].copy_from_slice(&dev_data[d..d + len]);
        check_bytes(
            host.as_slice()?,
            &want,
            &format!(
                "{len} bytes from device offset {dev_off} to host offset {host_off} (host buffer of {} bytes)",
                want.len()
            ),
        )?;
    }
    Ok(())
}

fn pinned(ctx: &CaseContext) -> CaseOutcome {
    let device = &ctx.device;
    let small = HostBuffer::new(HostMemory::PAGE - 1)?;
    ensure(!device.pin_host(&small)?, || {
        format!(
            "a host buffer of {} bytes (under a page) was reported pinned",
            small.len()
        )
    })?;
    let stream = device.create_stream()?;
    let mut answer = None;
    // (host offset, device offset, length, allocation size)
    for (i, &(host_off, dev_off, len, alloc)) in [
        (0usize, 0u64, 4096usize, 4096u64),
        (7, 13, 4097, 8192 + 64),
        (5, 1, MIB as usize + 13, MIB + 64),
    ]
    .iter()
    .enumerate()
    {
        let what = format!("{len} bytes at host offset {host_off}, device offset {dev_off}");
        let dev_data = pattern(200 + i as u64, alloc as usize);
        let dev = upload(device, &stream, &dev_data)?;
        let up_data = pattern(210 + i as u64, host_off + len + 9);
        let down_background = pattern(220 + i as u64, host_off + len + 9);
        let up = HostBuffer::from_bytes(&up_data)?;
        let mut down = HostBuffer::from_bytes(&down_background)?;
        let pinned = device.pin_host(&up)?;
        ensure(device.pin_host(&up)? == pinned, || {
            format!("pinning the same buffer twice gave two answers ({what})")
        })?;
        ensure(device.pin_host(&down)? == pinned, || {
            format!("two host buffers of the same size pinned differently ({what})")
        })?;
        ensure(answer.is_none_or(|a| a == pinned), || {
            format!("host buffers of different sizes pinned differently ({what})")
        })?;
        answer = Some(pinned);
        // Queued behind held work, so the copies are enqueued rather than done at once
        // on an idle stream.
        let held = hold(&stream)?;
        let range = dev.slice(dev_off, len as u64);
        stream.copy_from_host(&up, host_off as u64, range)?;
        // The buffer goes while its copy is in flight; the copy keeps it alive.
        drop(up);
        stream.copy_to_host(range, &down, host_off as u64)?;
        held.open();
        stream.synchronize()?;
        let mut want = down_background;
        want[host_off..host_off + len].copy_from_slice(&up_data[host_off..host_off + len]);
        check_bytes(
            down.as_slice()?,
            &want,
            &format!("a round trip through host buffers pinned={pinned}: {what}"),
        )?;
        let mut want = dev_data;
        let d = dev_off as usize;
        want[d..d + len].copy_from_slice(&up_data[host_off..host_off + len]);
        check_bytes(
            &stream.read(&dev)?,
            &want,
            &format!("the device range after a copy from a host buffer pinned={pinned}: {what}"),
        )?;
    }
    Ok(())
}

fn d2d_offsets(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    // Between allocations: (source offset, destination offset, length, allocation size).
    let between: [(u64, u64, u64, u64); 4] = [
        (0, 0, 1, 8),
        (3, 5, 3, 16),
        (13, 1, 4097, 8192),
        (7, 3, MIB + 13, MIB + 32),
    ];
    for (i, &(s_off, d_off, len, alloc)) in between.iter().enumerate() {
        let src_data = pattern(90 + i as u64, alloc as usize);
        let dst_data = pattern(95 + i as u64, alloc as usize);
        let src = upload(&ctx.device, &stream, &src_data)?;
        let dst = upload(&ctx.device, &stream, &dst_data)?;
        stream.copy(src.slice(s_off, len), dst.slice(d_off, len))?;
        let mut want = dst_data;
        let (s, d, n) = (s_off as usize, d_off as usize, len as usize);
        want[d..d + n].copy_from_slice(&src_data[s..s + n]);
        check_bytes(
            &stream.read(&dst)?,
            &want,
            &format!("{len} bytes from source offset {s_off} to destination offset {d_off}"),
        )?;
        check_bytes(
            &stream.read(&src)?,
            &src_data,
            "the copy's source afterwards",
        )?;
    }
    // Within one allocation: adjacent and distant disjoint ranges, both directions.
    let data = pattern(99, 10_000);
    let one = upload(&ctx.device, &stream, &data)?;
    let mut want = data;
    for &(s, d, n) in &[
        (0usize, 101usize, 101usize),
        (5001, 17, 4097),
        (9000, 9500, 500),
    ] {
        stream.copy(one.slice(s as u64, n as u64), one.slice(d as u64, n as u64))?;
        let chunk = want[s..s + n].to_vec();
        want[d..d + n].copy_from_slice(&chunk);
    }
    check_bytes(
        &stream.read(&one)?,
        &want,
        "three queued copies between disjoint ranges of one allocation",
    )
}

fn len_mismatch(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let a = upload(&ctx.device, &stream, &pattern(1, 64))?;
    let b = upload(&ctx.device, &stream, &pattern(2, 64))?;
    expect_invalid(
        stream.copy(a.slice(0, 16), b.slice(0, 17)),
        "a device copy of 16 bytes into a 17-byte range",
    )?;
    expect_invalid(
        stream.copy(a.slice(0, 17), b.slice(0, 16)),
        "a device copy of 17 bytes into a 16-byte range",
    )?;
    expect_invalid(
        stream.write(a.slice(0, 16), &[0; 15]),
        "a write of 15 bytes into a 16-byte range",
    )?;
    check_bytes(
        &stream.read(&b)?,
        &pattern(2, 64),
        "the destination of refused copies",
    )
}

fn overlap(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let data = pattern(5, 256);
    let a = upload(&ctx.device, &stream, &data)?;
    expect_invalid(
        stream.copy(a.slice(0, 64), a.slice(32, 64)),
        "a device copy from [0..64) to [32..96) of one allocation",
    )?;
    expect_invalid(
        stream.copy(a.slice(33, 64), a.slice(1, 64)),
        "a device copy from [33..97) to [1..65) of one allocation",
    )?;
    expect_invalid(
        stream.copy(a.slice(8, 8), a.slice(8, 8)),
        "a device copy from a range onto itself",
    )?;
    expect_invalid(
        stream.copy(a.slice(0, 9), a.slice(8, 9)),
        "a device copy whose ranges share one byte",
    )?;
    check_bytes(
        &stream.read(&a)?,
        &data,
        "an allocation after refused overlapping copies",
    )
}

fn out_of_bounds(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let data = pattern(6, 100);
    let a = upload(&ctx.device, &stream, &data)?;
    let b = upload(&ctx.device, &stream, &pattern(7, 100))?;
    let host = HostBuffer::new(200)?;
    expect_invalid(
        stream.copy_from_host(&host, 0, a.slice(99, 2)),
        "a host-to-device copy into [99..101) of a 100-byte allocation",
    )?;
    expect_invalid(
        stream.copy_to_host(a.slice(50, 51), &host, 0),
        "a device-to-host copy from [50..101) of a 100-byte allocation",
    )?;
    expect_invalid(
        stream.copy(a.slice(90, 20), b.slice(0, 20)),
        "a device copy from [90..110) of a 100-byte allocation",
    )?;
    expect_invalid(
        stream.copy(a.slice(0, 20), b.slice(81, 20)),
        "a device copy into [81..101) of a 100-byte allocation",
    )?;
    expect_invalid(
        stream.copy_from_host(&host, 0, a.slice(u64::MAX, 1)),
        "a copy to offset u64::MAX (offset + length overflows)",
    )?;
    expect_invalid(
        stream.copy_to_host(a.slice(101, 0), &host, 0),
        "an empty copy starting past the end of a 100-byte allocation",
    )?;
    expect_invalid(stream.read(a.slice(1, 100)), "a read of [1..101)")?;
    check_bytes(
        &stream.read(&a)?,
        &data,
        "an allocation after refused copies",
    )
}

fn host_out_of_bounds(ctx: &CaseContext) -> CaseOutcome {
    let stream = ctx.device.create_stream()?;
    let data = pattern(8, 64);
    let a = upload(&ctx.device, &stream, &data)?;
    let host = HostBuffer::new(16)?;
    expect_invalid(
        stream.copy_from_host(&host, 10, a.slice(0, 8)),
        "a host-to-device copy from host bytes [10..18) of a 16-byte host buffer",
    )?;
    expect_invalid(
        stream.copy_to_host(a.slice(0, 17), &host, 0),
        "a device-to-host copy of 17 bytes into a 16-byte host buffer",
    )?;
    expect_invalid(
        stream.copy_to_host(a.slice(0, 1), &host, u64::MAX),
        "a device-to-host copy to host offset u64::MAX",
    )?;
    expect_invalid(
        stream.copy_from_host(&host, 17, a.slice(0, 0)),
        "an empty host-to-device copy from past the end of the host buffer",
    )?;
    check_bytes(
        &stream.read(&a)?,
        &data,
        "an allocation after refused copies",
    )
}

fn peer(ctx: &CaseContext) -> CaseOutcome {
    let here = &ctx.device;
    let stream = here.create_stream()?;
    // Memory of this very device is a plain copy, whatever the capability.
    let data = pattern(0x9E, 4099);
    let a = upload(here, &stream, &data)?;
    let b = here.allocate(data.len() as u64)?;
    stream.copy_peer(a.slice(1, 4000), b.slice(3, 4000))?;
    let got = stream.read(b.slice(3, 4000))?;
    check_bytes(&got, &data[1..4001], "a peer copy within one device")?;

    let Some(peer) = ctx.peers.iter().find(|p| p.backend() == here.backend()) else {
        return Err(CaseError::skip(format!(
            "needs a second device of the {} backend",
            here.backend()
        )));
    };
    let peer_stream = peer.create_stream()?;
    let src = upload(peer, &peer_stream, &data)?;
    let dst = here.allocate(data.len() as u64 + 16)?;
    let written = peer_stream.record_event()?;
    stream.wait_event(&written)?;
    if !here.capabilities().peer_access {
        return expect_unsupported(
            stream.copy_peer(&src, dst.slice(0, data.len() as u64)),
            "a peer copy on a device without peer_access",
        );
    }
    stream.copy_peer(src.slice(0, 4099), dst.slice(7, 4099))?;
    let got = stream.read(&dst)?;
    check_bytes(&got[7..7 + 4099], &data, "a peer copy from another device")?;
    if got[..7].iter().chain(&got[7 + 4099..]).any(|&b| b != 0) {
        return Err(CaseError::fail(
            "a peer copy wrote outside its destination range",
        ));
    }
    expect_invalid(
        stream.copy_peer(src.slice(0, 10), dst.slice(0, 11)),
        "a peer copy whose lengths differ",
    )?;
    expect_invalid(
        stream.copy_peer(src.slice(4090, 10), dst.slice(0, 10)),
        "a peer copy past the end of its source",
    )?;
    if let Some(other) = ctx.peers.iter().find(|p| p.backend() != here.backend()) {
        let s = other.create_stream()?;
        let foreign = upload(other, &s, &data[..64])?;
        expect_invalid(
            stream.copy_peer(&foreign, dst.slice(0, 64)),
            "a peer copy from a device of another backend",
        )?;
    }
    Ok(())
}
