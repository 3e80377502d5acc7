//! `xpu bench collectives` under a real `mpirun`: one communicator over every process's
//! devices, every operation checked element by element, with two ranks per process and
//! with a host device and a simulated NPU in each process.

use std::process::Command;

use crate::{run, sim_npu, xpu};

/// Whether mpirun runs here; without it the test returns early, saying so, unless
/// `XPU_REQUIRE_MPI=1` (as CI sets), which makes that a failure.
fn mpirun_available() -> bool {
    let found = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("XPU_REQUIRE_MPI").map_or(true, |v| v.trim() != "1"),
            "mpirun is not installed, and XPU_REQUIRE_MPI=1"
        );
        eprintln!("skipped: mpirun is not installed (scripts/deps.sh installs Open MPI)");
    }
    found
}

/// `mpirun -np 2` around the `xpu` command with `args`, in the environment the `xpu`
/// helper gives it.
fn mpirun(args: &[&str]) -> Command {
    let helper = xpu(&[]);
    let mut m = Command::new("mpirun");
    m.args(["-np", "2", "--oversubscribe"])
        .arg(helper.get_program())
        .args(args);
    for (k, v) in helper.get_envs() {
        match v {
            Some(v) => m.env(k, v),
            None => m.env_remove(k),
        };
    }
    // Open MPI runs as root only when told that it is meant; one machine needs no
    // network transports.
    m.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl", "self,vader")
        .env("XPU_COLL_TIMEOUT", "120");
    m
}

#[test]
fn every_operation_across_processes_is_right_at_odd_sizes() {
    if !mpirun_available() {
        return;
    }
    let plugin = sim_npu();
    for devices in ["host:0,1", "host:0;plugin.simnpu:0"] {
        for coll in [
            "allreduce",
            "reduce",
            "broadcast",
            "allgather",
            "reducescatter",
            "alltoall",
        ] {
            let (code, out, err) = run(&mut mpirun(&[
                "--plugin",
                plugin.to_str().unwrap(),
                "bench",
                "collectives",
                "--devices",
                devices,
                "--coll",
                coll,
                "-b",
                "12",
                "-e",
                "300000",
                "-f",
                "50",
                "-n",
                "2",
                "-w",
                "1",
                "--json",
            ]));
            assert_eq!(code, 0, "{devices} {coll}:\n{out}\n{err}");
            let rows: Vec<serde_json::Value> = out
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(
                rows.len(),
                4,
                "{devices} {coll}: one row per size, printed once:\n{out}"
            );
            for r in &rows {
                assert_eq!(r["out_of_place"]["wrong"], 0, "{devices} {coll}: {r}");
                assert!(
                    r["algorithm"].as_str().unwrap().ends_with("mpi"),
                    "{devices} {coll}: {r}"
                );
            }
        }
    }
}
