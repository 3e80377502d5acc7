//! # xpu-train: data-parallel training on any mix of devices
//!
//! The workload the runtime exists for: a model built from the HAL's standard
//! operations ([`xpu_hal::ops`]), trained by the scheduler ([`xpu_scheduler`]) with one
//! replica per device and the gradients all-reduced by `xpu-collectives`.
//!
//! - [`checkpoint`]: checkpoints written atomically on a thread of their own, verified
//!   when read.
//! - [`data`]: the synthetic task, generated from the seed and the example's position.
//! - [`direct`]: the same training on one device without the scheduler, to measure
//!   what the scheduler costs.
//! - [`elastic`]: surviving a device failure — the group re-formed from the survivors,
//!   continuing from the last checkpoint.
//! - [`params`]: parameters in buckets, and their initial values from the seed.
//! - [`peak`]: a device's matrix-product peak, the denominator of the utilisation.
//! - [`precision`]: mixed precision — `bf16`/`f16` storage and products over `f32`
//!   masters, and `f16`'s dynamic loss scale.
//! - `exec`: where a model's operations go — the scheduler, or one stream directly.
//! - `replica`: one device's handles and the layers as tasks pinned to it.
//! - `mlp`: the MLP over modular addition.
//! - `transformer`: the decoder-only transformer reversing digits.
//! - [`split`]: micro-batches shared by the devices' learned speeds so that a step ends
//!   soonest.
//! - `tree`: the fixed order of the sum over micro-batches, and the blocks of it the
//!   replicas exchange.
//! - [`trainer`]: the step — micro-batches in rounds, each bucket's all-reduce
//!   submitted as soon as the backward pass has finished it (so it overlaps the rest of
//!   the backward pass), AdamW on every replica.
//!
//! Layers reach the devices only through the scheduler and the HAL contract: this crate
//! depends on no backend.

pub mod checkpoint;
pub mod data;
pub mod direct;
pub mod elastic;
mod exec;
mod mlp;
mod model;
pub mod params;
pub mod peak;
pub mod precision;
mod replica;
pub mod split;
pub mod trainer;
mod transformer;
mod tree;

pub use precision::{LossScale, Precision};
pub use trainer::{unsupported_op, ModelKind, StepReport, TrainConfig, Trainer};
