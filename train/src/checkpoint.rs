//! Checkpoints: what a run needs to continue bit for bit, written without stopping it.
//!
//! A checkpoint holds the configuration, the step (which is also the data position:
//! examples are generated from the seed and their index, and nothing else is random),
//! the split of the batch, every bucket's parameters (the `f32` masters) and AdamW
//! moments, and an `f16` run's loss scale. The gradients are not kept: a step starts
//! from zero.
//!
//! ## Format
//!
//! `step-NNNNNNNNNN.xpuckpt`: the magic `XPUCKPT1`, a little-endian `u32` header
//! length, the header (JSON: format version, configuration, step, split, parameter
//! names and shapes, bucket sizes, payload length, loss scale), the payload (per bucket, the
//! parameters, the first and the second moments as little-endian `f32`), and the
//! FNV-1a 64-bit checksum of everything before it (little-endian `u64`).
//!
//! ## Writing
//!
//! [`Writer`] takes a [`Checkpoint`] (already copied to host memory, so training goes
//! on) and writes it on its own thread: to a hidden temporary file, flushed to disk,
//! then renamed into place, then `latest` (naming the newest file) replaced the same
//! way — a crash at any moment leaves the previous checkpoint whole and `latest`
//! naming a complete file. The three newest checkpoints are kept.
//!
//! ## Reading
//!
//! [`Checkpoint::load`] reads a file (or the one `latest` names in a directory) and
//! verifies the magic, the header and the checksum before anything is used; a run
//! refuses a checkpoint whose configuration or parameters differ from its own, naming
//! the difference.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use serde::{Deserialize, Serialize};
use xpu_hal::{Error, Result};

use crate::params::ParamLayout;
use crate::precision::LossScale;
use crate::trainer::TrainConfig;

const MAGIC: &[u8; 8] = b"XPUCKPT1";
const VERSION: u32 = 1;
/// Checkpoints kept in a directory.
const KEEP: usize = 3;
/// The largest header accepted (a header is a few kilobytes).
const MAX_HEADER: u32 = 16 << 20;

/// A parameter's place in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamEntry {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub dims: Vec<u64>,
}

/// The header of a checkpoint file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    version: u32,
    config: TrainConfig,
    step: u64,
    shares: Vec<u64>,
    params: Vec<Vec<ParamEntry>>,
    bucket_elements: Vec<u64>,
    payload_bytes: u64,
    #[serde(default)]
    loss_scale: Option<LossScale>,
}

/// A run's state at the end of a step, in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The run's configuration.
    pub config: TrainConfig,
    /// Steps done.
    pub step: u64,
    /// Micro-batches per replica at that step.
    pub shares: Vec<u64>,
    /// The parameters, bucket by bucket.
    pub params: Vec<Vec<ParamEntry>>,
    /// Per bucket: parameters, first moments, second moments.
    pub buckets: Vec<[Vec<f32>; 3]>,
    /// The dynamic loss scale of an `f16` run.
    pub loss_scale: Option<LossScale>,
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::invalid(format!("{what} {}: {e}", path.display()))
}

impl Checkpoint {
    /// The entries of `layout`, bucket by bucket.
    pub fn entries(layout: &ParamLayout) -> Vec<Vec<ParamEntry>> {
        layout
            .specs
            .iter()
            .map(|b| {
                b.iter()
                    .map(|s| ParamEntry {
                        name: s.name.clone(),
                        dims: s.dims.clone(),
                    })
                    .collect()
            })
            .collect()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut payload = Vec::new();
        for bucket in &self.buckets {
            for part in bucket {
                payload.extend_from_slice(bytemuck::cast_slice(part));
            }
        }
        let header = Header {
            version: VERSION,
            config: self.config.clone(),
            step: self.step,
            shares: self.shares.clone(),
            params: self.params.clone(),
            bucket_elements: self.buckets.iter().map(|b| b[0].len() as u64).collect(),
            payload_bytes: payload.len() as u64,
            loss_scale: self.loss_scale,
        };
        let json = serde_json::to_vec(&header)
            .map_err(|e| Error::invalid(format!("could not encode a checkpoint header: {e}")))?;
        let mut out = Vec::with_capacity(12 + json.len() + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(json.len() as u32).to_le_bytes());
        out.extend_from_slice(&json);
        out.extend_from_slice(&payload);
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Parses and verifies a checkpoint file's bytes (`origin` names it in errors).
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Checkpoint> {
        let bad = |why: String| {
            Error::invalid(format!(
                "{origin} is not a usable checkpoint: {why}; nothing was loaded"
            ))
        };
        if bytes.len() < 20 || &bytes[..8] != MAGIC {
            return Err(bad("it does not start with the XPUCKPT1 magic".into()));
        }
        let (body, trailer) = bytes.split_at(bytes.len() - 8);
        let mut t = [0u8; 8];
        t.copy_from_slice(trailer);
        let (want_sum, sum) = (u64::from_le_bytes(t), fnv1a(body));
        if sum != want_sum {
            return Err(bad(format!(
                "its checksum is {sum:016x} but it says {want_sum:016x} (the file is corrupt or truncated)"
            )));
        }
        let len = u32::from_le_bytes([body[8], body[9], body[10], body[11]]);
        if len > MAX_HEADER || 12 + len as usize > body.len() {
            return Err(bad(format!(
                "its header length {len} runs past the end of the file ({} bytes)",
                bytes.len()
            )));
        }
        let header: Header = serde_json::from_slice(&body[12..12 + len as usize])
            .map_err(|e| bad(format!("its header does not parse ({e})")))?;
        if header.version != VERSION {
            return Err(bad(format!(
                "it is format version {}, this build reads version {VERSION}",
                header.version
            )));
        }
        let payload = &body[12 + len as usize..];
        if payload.len() as u64 != header.payload_bytes {
            return Err(bad(format!(
                "its payload is {} bytes, the header says {}",
                payload.len(),
                header.payload_bytes
            )));
        }
        let want: u64 = header.bucket_elements.iter().map(|e| e * 12).sum();
        if want != header.payload_bytes || header.params.len() != header.bucket_elements.len() {
            return Err(bad("its buckets do not add up to its payload".to_string()));
        }
        for (b, (entries, &elements)) in header
            .params
            .iter()
            .zip(&header.bucket_elements)
            .enumerate()
        {
            let sum: u64 = entries.iter().map(|e| e.dims.iter().product::<u64>()).sum();
            if sum != elements {
                return Err(bad(format!(
                    "bucket {b} holds {elements} elements but its parameters have {sum}"
                )));
            }
        }
        let floats: Vec<f32> = bytemuck::pod_collect_to_vec(payload);
        let mut at = 0usize;
        let mut buckets = Vec::new();
        for &e in &header.bucket_elements {
            let e = e as usize;
            let mut take = || {
                let part = floats[at..at + e].to_vec();
                at += e;
                part
            };
            buckets.push([take(), take(), take()]);
        }
        Ok(Checkpoint {
            config: header.config,
            step: header.step,
            shares: header.shares,
            params: header.params,
            buckets,
            loss_scale: header.loss_scale,
        })
    }

    /// Loads `path`: a checkpoint file, or a directory whose `latest` names one.
    pub fn load(path: &Path) -> Result<Checkpoint> {
        let file = if path.is_dir() {
            let latest = path.join("latest");
            let name = fs::read_to_string(&latest).map_err(|e| {
                io(
                    &latest,
                    "there is no checkpoint to resume from: cannot read",
                    e,
                )
            })?;
            let name = name.trim();
            if name.is_empty() || name.contains('/') || name.starts_with('.') {
                return Err(Error::invalid(format!(
                    "{} names `{name}`, not a checkpoint file of that directory",
                    latest.display()
                )));
            }
            path.join(name)
        } else {
            path.to_path_buf()
        };
        let bytes = fs::read(&file).map_err(|e| io(&file, "cannot read the checkpoint", e))?;
        Checkpoint::from_bytes(&bytes, &file.display().to_string())
    }
}

/// The file name of step `step`'s checkpoint.
fn file_name(step: u64) -> String {
    format!("step-{step:010}.xpuckpt")
}

/// Writes `bytes` to `dir/name` so that a crash leaves either the old file or the whole
/// new one: a temporary file, flushed, renamed into place, the directory flushed.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let target = dir.join(name);
    let mut f = File::create(&tmp).map_err(|e| io(&tmp, "cannot create", e))?;
    f.write_all(bytes)
        .map_err(|e| io(&tmp, "cannot write", e))?;
    f.sync_all().map_err(|e| io(&tmp, "cannot flush", e))?;
    drop(f);
    fs::rename(&tmp, &target).map_err(|e| io(&target, "cannot rename into", e))?;
    if let Ok(d) = File::open(dir) {
        // Best effort: some filesystems cannot flush a directory.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes checkpoints into a directory on a thread of its own.
pub struct Writer {
    dir: PathBuf,
    sender: Option<mpsc::SyncSender<Checkpoint>>,
    thread: Option<JoinHandle<Result<Vec<PathBuf>>>>,
}

impl Writer {
    /// A writer into `dir` (created if missing).
    pub fn new(dir: &Path) -> Result<Writer> {
        fs::create_dir_all(dir)
            .map_err(|e| io(dir, "cannot create the checkpoint directory", e))?;
        let (sender, receiver) = mpsc::sync_channel::<Checkpoint>(1);
        let d = dir.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("xpu-checkpoint".into())
            .spawn(move || -> Result<Vec<PathBuf>> {
                // The checkpoints already there count among those kept.
                let mut written: Vec<PathBuf> = fs::read_dir(&d)
                    .map_err(|e| io(&d, "cannot list", e))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("step-") && n.ends_with(".xpuckpt"))
                    })
                    .collect();
                written.sort();
                for c in receiver {
                    let name = file_name(c.step);
                    write_atomically(&d, &name, &c.to_bytes()?)?;
                    write_atomically(&d, "latest", name.as_bytes())?;
                    let path = d.join(&name);
                    written.retain(|p| *p != path);
                    written.push(path);
                    while written.len() > KEEP {
                        let old = written.remove(0);
                        fs::remove_file(&old).map_err(|e| io(&old, "cannot remove", e))?;
                    }
                }
                Ok(written)
            })
            .map_err(|e| Error::invalid(format!("cannot start the checkpoint writer: {e}")))?;
        Ok(Writer {
            dir: dir.to_path_buf(),
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Queues `checkpoint` (waiting while the one before is still queued); an error of
    /// the writer's shows here or at [`Writer::finish`].
    pub fn write(&mut self, checkpoint: Checkpoint) -> Result<()> {
        let sender = self
            .sender
            .as_ref()
            .ok_or_else(|| Error::invalid("the checkpoint writer was finished; make a new one"))?;
        if sender.send(checkpoint).is_err() {
            // The thread ended: its error says why.
            return self.finish().map(|_| ());
        }
        Ok(())
    }

    /// Waits for every queued checkpoint to be written; the paths of those kept.
    pub fn finish(&mut self) -> Result<Vec<PathBuf>> {
        self.sender = None;
        match self.thread.take() {
            None => Ok(Vec::new()),
            Some(t) => t.join().map_err(|p| {
                Error::from_panic(
                    &format!("the checkpoint writer of {}", self.dir.display()),
                    p.as_ref(),
                )
            })?,
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            config: TrainConfig::default(),
            step: 7,
            shares: vec![3, 5],
            params: vec![vec![ParamEntry {
                name: "w".into(),
                dims: vec![2, 2],
            }]],
            buckets: vec![[vec![1.0, 2.0, 3.0, 4.0], vec![0.5; 4], vec![0.25; 4]]],
            loss_scale: Some(LossScale {
                scale: 1024.0,
                clean: 3,
                skipped: 2,
            }),
        }
    }

    #[test]
    fn a_checkpoint_reads_back_and_every_corruption_is_refused() {
        let c = sample();
        let bytes = c.to_bytes().unwrap();
        assert_eq!(Checkpoint::from_bytes(&bytes, "x").unwrap(), c);
        // Every single flipped byte is caught (magic, length, header or payload).
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(Checkpoint::from_bytes(&b, "x").is_err(), "byte {i}");
        }
        for cut in [0, 5, 12, bytes.len() - 1] {
            let e = Checkpoint::from_bytes(&bytes[..cut], "x").unwrap_err();
            assert!(e.to_string().contains("nothing was loaded"), "{e}");
        }
    }

    #[test]
    fn the_writer_keeps_the_newest_and_latest_names_a_whole_file() {
        let dir = std::env::temp_dir().join(format!("xpu-ckpt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut w = Writer::new(&dir).unwrap();
        for step in 1..=5 {
            w.write(Checkpoint { step, ..sample() }).unwrap();
        }
        let kept = w.finish().unwrap();
        assert_eq!(kept.len(), KEEP);
        assert_eq!(Checkpoint::load(&dir).unwrap().step, 5);
        let files: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files.len(), KEEP + 1, "{files:?}");
        // A stale temporary file (a crash mid-write) changes nothing.
        fs::write(dir.join(".step-0000000006.xpuckpt.tmp"), b"half").unwrap();
        assert_eq!(Checkpoint::load(&dir).unwrap().step, 5);
        fs::remove_dir_all(&dir).unwrap();
    }
}
