//! Mixed precision on real host devices: `bf16` and `f16` runs learn as the `f32` run
//! does, keep `f32` masters, stay independent of the split and resume bit for bit; an
//! `f16` overflow skips the update and halves the loss scale.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use xpu_train::precision::INITIAL_SCALE;
use xpu_train::{Precision, TrainConfig, Trainer};

use support::host;

fn config(base: TrainConfig, precision: Precision) -> TrainConfig {
    TrainConfig {
        precision,
        rebalance_every: 0,
        ..base
    }
}

/// Both models reach the `f32` run's thresholds in low precision, their losses close
/// to the `f32` run's all along.
#[test]
fn low_precision_runs_learn_like_the_f32_run() {
    for (base, steps, first, last) in [
        (TrainConfig::default(), 100, 2.5, 0.5),
        (TrainConfig::transformer(), 60, 2.0, 0.5),
    ] {
        let mut reference =
            Trainer::new(&host("host:0"), config(base.clone(), Precision::F32)).unwrap();
        let want: Vec<f64> = (0..steps).map(|_| reference.step().unwrap().loss).collect();
        for precision in [Precision::Bf16, Precision::F16] {
            let mut t = Trainer::new(&host("host:0"), config(base.clone(), precision)).unwrap();
            let mut losses = Vec::new();
            for _ in 0..steps {
                let s = t.step().unwrap();
                assert_eq!(s.loss_scale.is_some(), precision == Precision::F16);
                losses.push(s.loss);
            }
            let acc = t.accuracy(256).unwrap();
            eprintln!(
                "{:?} {precision}: {:?}, accuracy {acc}",
                base.model,
                losses.iter().step_by(10).collect::<Vec<_>>()
            );
            assert!(losses[0] > first, "{precision}: {losses:?}");
            assert!(*losses.last().unwrap() < last, "{precision}: {losses:?}");
            assert!(acc > 0.9, "{precision}: {acc}");
            // The first step starts from the same weights: the losses differ only by
            // the low-precision rounding.
            let rel = (losses[0] - want[0]).abs() / want[0];
            assert!(rel < 0.02, "{precision}: {} against {}", losses[0], want[0]);
            assert_ne!(losses, want, "{precision} computed in f32");
        }
    }
}

/// Low precision keeps the slot scheme: any split over host devices gives the
/// one-device trajectory bit for bit, and a resumed run continues bit for bit (an
/// `f16` run with its loss scale).
#[test]
fn low_precision_is_split_independent_and_resumes_bit_for_bit() {
    for precision in [Precision::Bf16, Precision::F16] {
        let config = config(TrainConfig::transformer(), precision);
        let mut one = Trainer::new(&host("host:0"), config.clone()).unwrap();
        let losses: Vec<f64> = (0..8).map(|_| one.step().unwrap().loss).collect();
        let mut two = Trainer::new(&host("host:0,1"), config.clone()).unwrap();
        two.set_shares(&[3, 5]).unwrap();
        let split: Vec<f64> = (0..4).map(|_| two.step().unwrap().loss).collect();
        assert_eq!(split, losses[..4], "{precision}");
        let saved = two.checkpoint().unwrap();
        assert_eq!(saved.loss_scale.is_some(), precision == Precision::F16);
        let loaded =
            xpu_train::checkpoint::Checkpoint::from_bytes(&saved.to_bytes().unwrap(), "t").unwrap();
        let mut resumed = Trainer::new(&host("host:1"), config).unwrap();
        resumed.restore(&loaded).unwrap();
        let after: Vec<f64> = (0..4).map(|_| resumed.step().unwrap().loss).collect();
        assert_eq!(after, losses[4..], "{precision}");
        assert_eq!(
            resumed.read_parameters(0).unwrap(),
            one.read_parameters(0).unwrap(),
            "{precision}: the f32 masters"
        );
    }
}

/// A loss scale far too large overflows `f16`: the update is skipped (the masters do
/// not move), the scale halves each time until the gradients fit, and training goes on.
#[test]
fn an_f16_overflow_skips_the_update_and_halves_the_scale() {
    let config = config(TrainConfig::default(), Precision::F16);
    let mut t = Trainer::new(&host("host:0"), config.clone()).unwrap();
    let mut saved = t.checkpoint().unwrap();
    // 2^40 times the loss gradient: every gradient overflows f16's 65504.
    saved.loss_scale = Some(xpu_train::LossScale {
        scale: 2f32.powi(40),
        clean: 0,
        skipped: 0,
    });
    t.restore(&saved).unwrap();
    let before = t.read_parameters(0).unwrap();
    let first = t.step().unwrap();
    assert!(first.skipped, "{first:?}");
    assert_eq!(first.loss_scale, Some(2f32.powi(40)));
    assert_eq!(
        t.read_parameters(0).unwrap(),
        before,
        "a skipped update moved the masters"
    );
    assert_eq!(t.loss_scale().unwrap().scale, 2f32.powi(39));
    let mut skipped = 1;
    let mut losses = Vec::new();
    for _ in 0..60 {
        let s = t.step().unwrap();
        skipped += u64::from(s.skipped);
        losses.push(s.loss);
    }
    let scale = t.loss_scale().unwrap();
    assert_eq!(scale.skipped, skipped);
    assert!(skipped < 40, "{skipped} updates skipped");
    assert!(scale.scale < INITIAL_SCALE * 2f32.powi(8), "{scale:?}");
    assert!(losses.last().unwrap() < &losses[0], "{losses:?}");
}

/// The direct path (no scheduler) gives the scheduled trajectory in low precision too.
#[test]
fn the_direct_path_gives_the_scheduled_trajectory_in_low_precision() {
    for precision in [Precision::Bf16, Precision::F16] {
        let config = config(TrainConfig::transformer(), precision);
        let devices = host("host:0");
        let mut scheduled = Trainer::new(&devices, config.clone()).unwrap();
        let mut direct = xpu_train::direct::DirectTrainer::new(&devices[0], config).unwrap();
        for _ in 0..4 {
            assert_eq!(
                direct.step().unwrap(),
                scheduled.step().unwrap().loss,
                "{precision}"
            );
        }
    }
}
