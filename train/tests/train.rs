//! Training on real host devices: the loss falls, replicas stay identical, and the
//! split of the batch does not change the trajectory beyond rounding.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use xpu_train::{TrainConfig, Trainer};

use support::host;

#[test]
fn the_mlp_learns_modular_addition() {
    let mut t = Trainer::new(&host("host:0"), TrainConfig::default()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..150 {
        losses.push(t.step().unwrap().loss);
    }
    eprintln!("{losses:?}");
    let acc = t.accuracy(512).unwrap();
    eprintln!("accuracy {acc}");
    assert!(losses[0] > 2.5, "{losses:?}");
    assert!(*losses.last().unwrap() < 0.5, "{losses:?}");
    assert!(acc > 0.9, "{acc}");
}

fn run(devices: &str, shares: Option<&[u64]>, steps: usize) -> (Vec<f64>, Trainer) {
    let config = TrainConfig {
        rebalance_every: 0,
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(&host(devices), config).unwrap();
    if let Some(s) = shares {
        t.set_shares(s).unwrap();
    }
    let losses = (0..steps).map(|_| t.step().unwrap().loss).collect();
    (losses, t)
}

#[test]
fn any_split_over_host_devices_gives_the_one_device_trajectory_bit_for_bit() {
    let (one, single) = run("host:0", None, 20);
    for shares in [[4u64, 4], [5, 3], [8, 0], [1, 7]] {
        let (two, t) = run("host:0,1", Some(&shares), 20);
        assert_eq!(one, two, "{shares:?}");
        let params = t.read_parameters(0).unwrap();
        assert_eq!(params, t.read_parameters(1).unwrap(), "{shares:?}");
        assert_eq!(params, single.read_parameters(0).unwrap(), "{shares:?}");
    }
}

#[test]
fn bad_configurations_are_refused_with_the_reason() {
    let devs = host("host:0");
    let bad = |c: TrainConfig| Trainer::new(&devs, c).err().unwrap().to_string();
    let d = TrainConfig::default;
    assert!(bad(TrainConfig {
        global_batch: 100,
        ..d()
    })
    .contains("not a multiple"));
    assert!(bad(TrainConfig {
        micro_batch: 0,
        ..d()
    })
    .contains("at least 1"));
    assert!(bad(TrainConfig { modulus: 1, ..d() }).contains("modulus"));
    assert!(bad(TrainConfig {
        lr: f32::NAN,
        ..d()
    })
    .contains("learning rate"));
    assert!(bad(TrainConfig { hidden: 0, ..d() }).contains("widths"));
    assert!(Trainer::new(&[], d())
        .err()
        .unwrap()
        .to_string()
        .contains("no device"));
    let mut t = Trainer::new(&devs, d()).unwrap();
    assert!(t
        .set_shares(&[3])
        .unwrap_err()
        .to_string()
        .contains("adding up"));
}

#[test]
fn the_transformer_learns_to_reverse_digits() {
    let mut t = Trainer::new(&host("host:0"), TrainConfig::transformer()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..80 {
        losses.push(t.step().unwrap().loss);
    }
    let acc = t.accuracy(256).unwrap();
    eprintln!(
        "{:?}\naccuracy {acc}",
        losses.iter().step_by(10).collect::<Vec<_>>()
    );
    assert!(losses[0] > 2.0, "{losses:?}");
    assert!(*losses.last().unwrap() < 0.5, "{losses:?}");
    assert!(acc > 0.9, "{acc}");
}

#[test]
fn a_resumed_run_continues_bit_for_bit_on_the_same_or_other_devices() {
    let config = TrainConfig {
        rebalance_every: 0,
        ..TrainConfig::transformer()
    };
    let mut whole = Trainer::new(&host("host:0,1"), config.clone()).unwrap();
    let losses: Vec<f64> = (0..8).map(|_| whole.step().unwrap().loss).collect();
    let mut first = Trainer::new(&host("host:0,1"), config.clone()).unwrap();
    for _ in 0..4 {
        first.step().unwrap();
    }
    let saved = first.checkpoint().unwrap();
    let bytes = saved.to_bytes().unwrap();
    let loaded = xpu_train::checkpoint::Checkpoint::from_bytes(&bytes, "test").unwrap();
    assert_eq!(loaded, saved);
    for devices in ["host:0,1", "host:1"] {
        let mut resumed = Trainer::new(&host(devices), config.clone()).unwrap();
        resumed.restore(&loaded).unwrap();
        assert_eq!(resumed.steps_done(), 4);
        let after: Vec<f64> = (0..4).map(|_| resumed.step().unwrap().loss).collect();
        assert_eq!(after, losses[4..], "{devices}");
        assert_eq!(
            resumed.read_parameters(0).unwrap(),
            whole.read_parameters(0).unwrap()
        );
    }
    // Another configuration refuses it, changing nothing.
    let mut other = Trainer::new(&host("host:0"), TrainConfig { lr: 1e-3, ..config }).unwrap();
    let before = other.read_parameters(0).unwrap();
    let e = other.restore(&loaded).unwrap_err();
    assert!(e.to_string().contains("learning rate 0.003"), "{e}");
    assert_eq!(other.read_parameters(0).unwrap(), before);
    assert_eq!(other.steps_done(), 0);
}

/// A host device lost mid-run for real (an injected fault): the step fails, recovery
/// finds the lost device, re-forms the group from the survivor and continues from the
/// last checkpoint — and the trajectory is the undisturbed one, bit for bit.
#[test]
fn a_lost_device_is_dropped_and_training_continues_from_the_last_checkpoint() {
    use xpu_hal::backend::Fault;
    use xpu_train::elastic;
    let (undisturbed, _) = run("host:0,1", None, 14);
    let config = TrainConfig {
        rebalance_every: 0,
        ..TrainConfig::default()
    };
    let devices = host("host:0,1");
    let mut t = Trainer::new(&devices, config).unwrap();
    let mut losses = Vec::new();
    let mut last = None;
    let mut recoveries = Vec::new();
    while t.steps_done() < 14 {
        if t.steps_done() == 9 && recoveries.is_empty() {
            devices[1].inject_fault(Fault::Lost).unwrap();
        }
        match t.step() {
            Ok(r) => {
                losses.truncate(r.step as usize - 1);
                losses.push(r.loss);
                if r.step % 4 == 0 {
                    last = Some(t.checkpoint().unwrap());
                }
            }
            Err(e) => {
                let (next, recovery) = elastic::recover(t, e, last.as_ref()).unwrap();
                recoveries.push(recovery);
                t = next;
            }
        }
    }
    assert_eq!(recoveries.len(), 1, "{recoveries:?}");
    let r = &recoveries[0];
    assert_eq!(r.failed_step, 10);
    assert_eq!(r.resumed_at, 8);
    assert_eq!(r.survivors, ["host:0"]);
    assert_eq!(r.lost.len(), 1);
    assert_eq!(r.lost[0].0, "host:1");
    assert!(r.lost[0].1.contains("lost"), "{:?}", r.lost);
    assert_eq!(losses, undisturbed);
}

/// The last device failing ends the run with an error naming the last checkpoint.
#[test]
fn losing_the_last_device_stops_with_the_last_checkpoint_named() {
    use xpu_hal::backend::Fault;
    let devices = host("host:1");
    let mut t = Trainer::new(&devices, TrainConfig::default()).unwrap();
    t.step().unwrap();
    let c = t.checkpoint().unwrap();
    devices[0].inject_fault(Fault::Lost).unwrap();
    let e = t.step().unwrap_err();
    let e = match xpu_train::elastic::recover(t, e, Some(&c)) {
        Ok(_) => panic!("recovered with no device left"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("no device is left") && e.contains("step 1"),
        "{e}"
    );
}

/// The direct path (one stream, no scheduler) trains the same model to the same bits:
/// the bench that compares their speed compares the same work.
#[test]
fn the_direct_path_gives_the_scheduled_trajectory() {
    for config in [TrainConfig::default(), TrainConfig::transformer()] {
        let config = TrainConfig {
            rebalance_every: 0,
            ..config
        };
        let devices = host("host:0");
        let mut scheduled = Trainer::new(&devices, config.clone()).unwrap();
        let mut direct = xpu_train::direct::DirectTrainer::new(&devices[0], config).unwrap();
        for _ in 0..4 {
            let s = scheduled.step().unwrap();
            assert_eq!(direct.tokens_per_step(), s.tokens);
            assert_eq!(direct.step().unwrap(), s.loss);
        }
    }
}

/// A device far slower than the other gets a small share within a few steps: the
/// models calibrate every codelet of a step quickly, and the split uses them.
#[test]
fn a_much_slower_device_gets_a_small_share_within_a_few_steps() {
    use xpu_hal::backend::Fault;
    let devices = host("host:0,1");
    devices[1]
        .inject_fault(Fault::Slow(std::time::Duration::from_millis(1)))
        .unwrap();
    let mut t = Trainer::new(&devices, TrainConfig::default()).unwrap();
    for _ in 0..6 {
        t.step().unwrap();
    }
    let shares = t.shares().to_vec();
    let slow_share = if t.devices().len() == 1 { 0 } else { shares[1] };
    assert!(slow_share <= 2, "{shares:?}");
    devices[1]
        .inject_fault(Fault::Slow(std::time::Duration::ZERO))
        .unwrap();
}

/// A device of the same kind as the other but throttled to a quarter of its speed gets
/// a smaller share: each device has models of its own, and the throttle's sleeps fall
/// beside the work they stretch, where the task timings see them.
#[test]
fn a_throttled_device_of_the_same_kind_gets_a_smaller_share() {
    use xpu_hal::backend::Fault;
    let devices = host("host:0,1");
    devices[1].inject_fault(Fault::Throttle(25)).unwrap();
    let mut t = Trainer::new(&devices, TrainConfig::default()).unwrap();
    for _ in 0..6 {
        t.step().unwrap();
    }
    let shares = t.shares().to_vec();
    devices[1].inject_fault(Fault::Throttle(100)).unwrap();
    let slow_share = if t.devices().len() == 1 { 0 } else { shares[1] };
    assert!(slow_share <= 2, "{shares:?}");
}

/// Replayed steps (recorded once, their inputs rewritten) train exactly as steps
/// submitted task by task: on one device, a trainer that never rebalances replays from
/// its second step, one that rebalances every 1000 steps submits all of them.
#[test]
fn replayed_steps_give_the_submitted_trajectory() {
    let devices = host("host:0");
    let run = |every| {
        let config = TrainConfig {
            rebalance_every: every,
            ..TrainConfig::transformer()
        };
        let mut t = Trainer::new(&devices, config).unwrap();
        let losses: Vec<f64> = (0..6).map(|_| t.step().unwrap().loss).collect();
        (losses, t.read_parameters(0).unwrap(), t.replayed_steps())
    };
    let (replayed, replayed_params, replays) = run(0);
    let (submitted, submitted_params, none) = run(1000);
    assert_eq!((replays, none), (5, 0));
    assert_eq!(replayed, submitted);
    assert_eq!(replayed_params, submitted_params);
}
