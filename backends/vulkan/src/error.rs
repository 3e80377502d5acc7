//! Vulkan result codes mapped onto the HAL's errors, with the code in the message.

use ash::vk;
use xpu_hal::Error;

/// Maps a failed Vulkan call to a HAL error. `what` names the call and its purpose.
pub(crate) fn vk_error(device: &str, what: &str, result: vk::Result) -> Error {
    match result {
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
            Error::OutOfMemory {
                device: device.to_string(),
                requested: 0,
                free: 0,
                capacity: 0,
                hint: format!("{what} failed with {result:?}; free memory or use smaller buffers"),
            }
        }
        vk::Result::ERROR_DEVICE_LOST => Error::DeviceLost {
            device: device.to_string(),
            message: format!("{what} failed with {result:?}"),
        },
        vk::Result::TIMEOUT => Error::Timeout {
            message: format!("{what} on {device} timed out ({result:?})"),
        },
        other => Error::backend_message(
            "vulkan",
            format!("{what} on {device} failed with {other:?}"),
        ),
    }
}

/// Extension for `VkResult<T>`: attach context and map to a HAL error.
pub(crate) trait VkResultExt<T> {
    /// Maps the error with [`vk_error`].
    fn vk(self, device: &str, what: &str) -> xpu_hal::Result<T>;
}

impl<T> VkResultExt<T> for Result<T, vk::Result> {
    fn vk(self, device: &str, what: &str) -> xpu_hal::Result<T> {
        self.map_err(|r| vk_error(device, what, r))
    }
}
