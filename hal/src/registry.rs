//! The backend [`Registry`]: which backends exist, which devices they have, and the
//! lazily created [`Device`] handles.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use crate::backend::{Backend, DeviceSummary};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::id::{DeviceId, DeviceSelector};

/// Whether a backend can be used on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Present, with these devices.
    Available(Vec<DeviceSummary>),
    /// Not present, with the reason (no driver, no library …).
    Unavailable(String),
}

/// A backend's name and availability, as `xpu devices` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendStatus {
    /// The backend's name.
    pub name: String,
    /// Whether it is present.
    pub availability: Availability,
}

struct Entry {
    backend: Arc<dyn Backend>,
    /// Enumerated once; `enumerate` is cheap but need not be free.
    enumerated: OnceLock<Availability>,
    /// Devices created so far, by index.
    devices: Mutex<BTreeMap<u32, Device>>,
}

impl Entry {
    fn availability(&self) -> &Availability {
        self.enumerated
            .get_or_init(|| match self.backend.enumerate() {
                Ok(list) => Availability::Available(list),
                Err(Error::Unavailable { reason, .. }) => Availability::Unavailable(reason),
                Err(other) => Availability::Unavailable(other.to_string()),
            })
    }

    fn device(&self, index: u32) -> Result<Device> {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = devices.get(&index) {
            return Ok(d.clone());
        }
        let imp = self.backend.create_device(index)?;
        let device = Device::from_impl(DeviceId::new(self.backend.name(), index), imp);
        devices.insert(index, device.clone());
        Ok(device)
    }
}

/// The set of backends a process uses. Enumeration is cheap and cached; devices are
/// created on first use and then shared. Thread-safe.
#[derive(Default)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl Registry {
    /// An empty registry; add backends with [`Registry::register`].
    pub fn new() -> Self {
        Registry::default()
    }

    /// Adds a backend. Names must be unique.
    pub fn register(&mut self, backend: Arc<dyn Backend>) -> Result<()> {
        if self
            .entries
            .iter()
            .any(|e| e.backend.name() == backend.name())
        {
            return Err(Error::invalid(format!(
                "a backend named `{}` is already registered; give each backend a unique name",
                backend.name()
            )));
        }
        self.entries.push(Entry {
            backend,
            enumerated: OnceLock::new(),
            devices: Mutex::new(BTreeMap::new()),
        });
        Ok(())
    }

    /// Every registered backend with its availability, in registration order.
    pub fn backends(&self) -> Vec<BackendStatus> {
        self.entries
            .iter()
            .map(|e| BackendStatus {
                name: e.backend.name().to_string(),
                availability: e.availability().clone(),
            })
            .collect()
    }

    /// Each backend's diagnostics ([`Backend::diagnostics`]) that are not empty, as
    /// `(backend name, messages)`.
    pub fn diagnostics(&self) -> Vec<(String, Vec<String>)> {
        self.entries
            .iter()
            .map(|e| (e.backend.name().to_string(), e.backend.diagnostics()))
            .filter(|(_, m)| !m.is_empty())
            .collect()
    }

    fn entry(&self, backend: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.backend.name() == backend)
    }

    /// The device with this id, created on first use.
    pub fn device(&self, id: &DeviceId) -> Result<Device> {
        let entry = self.entry(&id.backend).ok_or_else(|| {
            Error::invalid(format!(
                "there is no backend `{}`; registered backends: {}",
                id.backend,
                self.entries
                    .iter()
                    .map(|e| e.backend.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        match entry.availability() {
            Availability::Unavailable(reason) => {
                Err(Error::unavailable(id.backend.clone(), reason.clone()))
            }
            Availability::Available(list) => {
                if !list.iter().any(|d| d.index == id.index) {
                    return Err(Error::invalid(format!(
                        "device {id} does not exist; backend `{}` has {} device(s){}",
                        id.backend,
                        list.len(),
                        if list.is_empty() {
                            String::new()
                        } else {
                            format!(
                                ": {}",
                                list.iter()
                                    .map(|d| format!("{}:{}", id.backend, d.index))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                    )));
                }
                entry.device(id.index)
            }
        }
    }

    /// Every device the selector picks, in registration then index order. Devices of
    /// unavailable backends are skipped, unless the selector names one explicitly, which
    /// is an error, as is naming a device that does not exist.
    pub fn devices(&self, selector: &DeviceSelector) -> Result<Vec<Device>> {
        for id in selector.explicit_devices() {
            self.device(&id)?;
        }
        let mut out = Vec::new();
        for entry in &self.entries {
            let name = entry.backend.name();
            if !selector.mentions_backend(name) {
                continue;
            }
            if let Availability::Available(list) = entry.availability() {
                for d in list {
                    if selector.matches(name, d.index) {
                        out.push(entry.device(d.index)?);
                    }
                }
            }
        }
        Ok(out)
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| e.backend.name()))
            .finish()
    }
}
