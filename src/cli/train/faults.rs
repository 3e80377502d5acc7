//! `--inject-fault DEVICE@STEP`: devices made to fail for real, through their backend,
//! when a step begins.

use xpu::backend::Fault;
use xpu::{Device, Error, Result};

/// A fault to inject.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The device, one of the run's.
    pub device: Device,
    /// The step it fails at (before that step's work is submitted).
    pub step: u64,
    /// Whether it has been injected.
    pub done: bool,
}

/// Parses every `--inject-fault` value against the run's devices and steps.
pub fn parse(texts: &[String], devices: &[Device], steps: u64) -> Result<Vec<Planned>> {
    texts
        .iter()
        .map(|text| {
            let bad = |why: &str| {
                Error::invalid(format!(
                    "--inject-fault `{text}`: {why}; give DEVICE@STEP, e.g. host:1@40"
                ))
            };
            let (name, step) = text.rsplit_once('@').ok_or_else(|| bad("no `@`"))?;
            let step: u64 = step
                .parse()
                .map_err(|_| bad("the step is not a whole number"))?;
            if step == 0 || step > steps {
                return Err(bad(&format!("the step must be 1 to --steps ({steps})")));
            }
            let device = devices
                .iter()
                .find(|d| d.id().to_string() == name)
                .ok_or_else(|| {
                    let names: Vec<String> = devices.iter().map(|d| d.id().to_string()).collect();
                    bad(&format!(
                        "{name} is not one of the devices trained on ({})",
                        names.join(", ")
                    ))
                })?;
            Ok(Planned {
                device: device.clone(),
                step,
                done: false,
            })
        })
        .collect()
}

/// Injects the faults due at `step` (each once), returning the devices made to fail.
pub fn fire(planned: &mut [Planned], step: u64) -> Result<Vec<String>> {
    let mut fired = Vec::new();
    for p in planned.iter_mut().filter(|p| !p.done && p.step == step) {
        p.device.inject_fault(Fault::Lost)?;
        p.done = true;
        fired.push(p.device.id().to_string());
    }
    Ok(fired)
}
