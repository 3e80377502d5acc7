//! Host buffers pinned for a Vulkan device are imported as buffers
//! (`VK_EXT_external_memory_host`) wherever the device has the extension, and copies go
//! straight between them and device memory, in stream order.

#![allow(clippy::unwrap_used)]

use xpu_hal::backend::Backend;
use xpu_hal::{Device, DeviceId, HostBuffer, Scalar};
use xpu_vulkan::VulkanBackend;

/// The first Vulkan device, or `None` (with a note) where there is none and CI does not
/// require one.
fn device() -> Option<Device> {
    let backend = VulkanBackend::new();
    match backend.enumerate() {
        Ok(_) => Some(Device::from_impl(
            DeviceId::new("vulkan", 0),
            backend.create_device(0).unwrap(),
        )),
        Err(e) => {
            let required = std::env::var("XPU_REQUIRE")
                .is_ok_and(|v| v.split(',').any(|p| p.trim() == "vulkan"));
            assert!(!required, "Vulkan is required here: {e}");
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn devices_with_host_import_pin_and_copy_through_the_import_in_order() {
    let Some(device) = device() else { return };
    let imports = device
        .info()
        .extra
        .iter()
        .any(|e| e.strip_prefix("host_import=").is_some_and(|v| v != "none"));
    let len = 3 << 20;
    let mut down = HostBuffer::new(len).unwrap();
    let up = HostBuffer::from_bytes(&vec![7u8; len]).unwrap();
    assert_eq!(
        device.pin_host(&down).unwrap(),
        imports,
        "{:?}",
        device.info().extra
    );
    assert_eq!(device.pin_host(&up).unwrap(), imports);
    let stream = device.create_stream().unwrap();
    let a = device.allocate(len as u64).unwrap();
    for round in 0..3u8 {
        // A fill, an upload over part of it and a download of the whole, queued back to
        // back: the download must see both, in order.
        stream.fill(&a, Scalar::U8(round)).unwrap();
        stream
            .copy_from_host(&up, 4096 + 3, a.slice(1 << 20, 1 << 20))
            .unwrap();
        stream.copy_to_host(&a, &down, 0).unwrap();
        stream.synchronize().unwrap();
        let got = down.as_slice().unwrap();
        let wrong = got
            .iter()
            .enumerate()
            .filter(|&(i, &b)| {
                b != if (1 << 20..2 << 20).contains(&i) {
                    7
                } else {
                    round
                }
            })
            .count();
        assert_eq!(wrong, 0, "round {round}: {wrong} wrong bytes");
    }
}
