//! `--inject-fault DEVICE@STEP[:slow=DURATION|:speed=PERCENT%]`: devices made to fail
//! for real (lost, a straggler whose every operation takes longer, or one throttled to
//! a share of its speed), through their backend, when a step begins. Across processes a
//! device is named with its process (`host:0@p1`, as the run lists its ranks) and only
//! that process injects it; `process:N@STEP` makes process N die.

use std::time::Duration;

use xpu::backend::Fault;
use xpu::{Device, Error, Result};

/// A fault to inject.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The device, one of the run's.
    pub device: Device,
    /// The step it fails at (before that step's work is submitted).
    pub step: u64,
    /// What happens to it.
    pub fault: Fault,
    /// Whether it has been injected.
    pub done: bool,
}

/// Parses every `--inject-fault` value against the run's devices and steps; across
/// processes (`process`: this one's index and the count), keeps only this process's.
pub fn parse(
    texts: &[String],
    devices: &[Device],
    process: Option<(usize, usize)>,
    steps: u64,
) -> Result<Vec<Planned>> {
    texts
        .iter()
        .map(|text| {
            let bad = |why: &str| {
                Error::invalid(format!(
                    "--inject-fault `{text}`: {why}; give DEVICE@STEP (lost), DEVICE@STEP:slow=DURATION (a straggler) or DEVICE@STEP:speed=PERCENT% (throttled), e.g. host:1@40, plugin.simnpu:0@20:slow=2ms or host:1@20:speed=50%"
                ))
            };
            let (name, when) = text.rsplit_once('@').ok_or_else(|| bad("no `@`"))?;
            // Across processes, `DEVICE@pN`: process N's device.
            let (name, owner) = match (process, name.rsplit_once("@p")) {
                (Some((_, processes)), Some((device, n))) => {
                    let n: usize = n
                        .parse()
                        .ok()
                        .filter(|n| *n < processes)
                        .ok_or_else(|| {
                            bad(&format!(
                                "`@p{n}` names no process of the {processes} (p0 to p{})",
                                processes.saturating_sub(1)
                            ))
                        })?;
                    (device, Some(n))
                }
                (Some(_), None) => {
                    return Err(bad(
                        "across processes name the device with its process, e.g. host:0@p1",
                    ))
                }
                (None, _) => (name, None),
            };
            let (step, fault) = match when.split_once(':') {
                None => (when, Fault::Lost),
                Some((step, what)) => {
                    if let Some(d) = what.strip_prefix("slow=") {
                        (step, Fault::Slow(duration(d).map_err(|why| bad(&why))?))
                    } else if let Some(p) = what.strip_prefix("speed=") {
                        let percent = p
                            .strip_suffix('%')
                            .and_then(|p| p.parse::<u32>().ok())
                            .filter(|p| (1..=100).contains(p))
                            .ok_or_else(|| {
                                bad(&format!(
                                    "`speed={p}`: give the share of its speed the device keeps, 1% to 100%"
                                ))
                            })?;
                        (step, Fault::Throttle(percent))
                    } else {
                        return Err(bad(&format!("unknown fault `{what}`")));
                    }
                }
            };
            let step: u64 = step
                .parse()
                .map_err(|_| bad("the step is not a whole number"))?;
            if step == 0 || step > steps {
                return Err(bad(&format!("the step must be 1 to --steps ({steps})")));
            }
            if let (Some((me, _)), Some(n)) = (process, owner) {
                if n != me {
                    return Ok(None);
                }
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
            Ok(Some(Planned {
                device: device.clone(),
                step,
                fault,
                done: false,
            }))
        })
        .filter_map(Result::transpose)
        .collect()
}

/// The step at which this process (index `me` of `processes`, if it has one) is to
/// die, from `--inject-fault process:N@STEP` entries (`texts`).
pub fn dies_at(
    texts: &[String],
    processes: usize,
    me: Option<usize>,
    steps: u64,
) -> Result<Option<u64>> {
    let mut at = None;
    for text in texts {
        let bad = |why: &str| {
            Error::invalid(format!(
                "--inject-fault `{text}`: {why}; give process:N@STEP, e.g. process:1@20"
            ))
        };
        let rest = text
            .strip_prefix("process:")
            .ok_or_else(|| bad("no `process:`"))?;
        let (n, step) = rest.split_once('@').ok_or_else(|| bad("no `@`"))?;
        let n: usize = n
            .parse()
            .map_err(|_| bad("the process is not a whole number"))?;
        let step: u64 = step
            .parse()
            .map_err(|_| bad("the step is not a whole number"))?;
        if n >= processes {
            return Err(bad(&format!(
                "there are {processes} processes (0 to {})",
                processes.saturating_sub(1)
            )));
        }
        if step == 0 || step > steps {
            return Err(bad(&format!("the step must be 1 to --steps ({steps})")));
        }
        if me == Some(n) {
            at = Some(at.map_or(step, |a: u64| a.min(step)));
        }
    }
    Ok(at)
}

/// `500us`, `2ms`, `0.5s`: a duration of up to a minute.
fn duration(text: &str) -> std::result::Result<Duration, String> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(format!("`{text}` needs a unit: us, ms or s")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{number}` is not a number"))?;
    Duration::try_from_secs_f64(value * scale)
        .ok()
        .filter(|d| *d <= Duration::from_secs(60))
        .ok_or_else(|| format!("`{text}` is not a delay from 0 to 60 s"))
}

/// Injects the faults due at `step` (each once), returning what was done to whom.
pub fn fire(planned: &mut [Planned], step: u64) -> Result<Vec<(String, Fault)>> {
    let mut fired = Vec::new();
    for p in planned.iter_mut().filter(|p| !p.done && p.step == step) {
        p.device.inject_fault(p.fault)?;
        p.done = true;
        fired.push((p.device.id().to_string(), p.fault));
    }
    Ok(fired)
}

#[cfg(test)]
mod tests {
    use super::duration;
    use std::time::Duration;

    #[test]
    fn durations_need_a_unit_and_a_sane_size() {
        assert_eq!(duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(duration("0.5s"), Ok(Duration::from_millis(500)));
        for bad in ["2", "ms", "-1ms", "2h", "1e9s", "NaNms", "infs"] {
            assert!(duration(bad).is_err(), "{bad}");
        }
    }
}
