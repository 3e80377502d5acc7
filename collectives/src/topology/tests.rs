use super::*;

/// Two NUMA nodes; node 0 has a switch with GPUs 1b and 1c (NVLinked), node 1 a switch
/// with GPUs 8b and 8c.
const DGX_LIKE: &str = r#"<?xml version="1.0"?>
<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">
    <pci busid="0000:1a:00.0" class="0x060400" vendor="0x10b5" device="0x8747" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:1b:00.0" class="0x030200" vendor="0x10de" device="0x2335" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90" rank="0" gdr="1">
          <nvlink target="0000:1c:00.0" count="18" tclass="0x030200"/>
        </gpu>
      </pci>
      <pci busid="0000:1c:00.0" class="0x030200" vendor="0x10de" device="0x2335" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="90" rank="1" gdr="1">
          <nvlink target="0000:1b:00.0" count="18" tclass="0x030200"/>
        </gpu>
      </pci>
    </pci>
    <nic><net name="mlx5_0" dev="0" speed="100000"/></nic>
  </cpu>
  <cpu numaid="1" affinity="ffff0000" arch="x86_64" vendor="GenuineIntel">
    <pci busid="0000:8a:00.0" class="0x060400" vendor="0x10b5" device="0x8747">
      <pci busid="0000:8B:00.0" class="0x030200" vendor="0x10de" device="0x2335"/>
      <pci busid="0000:8c:00.0" class="0x030200" vendor="0x10de" device="0x2335"/>
    </pci>
  </cpu>
</system>
"#;

fn gpu(index: u32, bus: &str, peers: &[u32]) -> TopoDevice {
    TopoDevice {
        id: format!("cuda:{index}"),
        backend: "cuda".into(),
        name: "GPU".into(),
        kind: "gpu".into(),
        pci_bus_id: host::normalize_bus_id(bus),
        numa_node: None,
        process: 0,
        node: 0,
        reduce_gbps: None,
        peers: peers.to_vec(),
        direct: Vec::new(),
        index,
        host_memory: false,
    }
}

fn host_device(index: u32) -> TopoDevice {
    TopoDevice {
        id: format!("host:{index}"),
        backend: "host".into(),
        name: "CPU".into(),
        kind: "cpu".into(),
        pci_bus_id: None,
        numa_node: None,
        process: 0,
        node: 0,
        reduce_gbps: None,
        peers: Vec::new(),
        direct: Vec::new(),
        index,
        host_memory: true,
    }
}

fn dgx() -> Topology {
    let host = nccl_xml::parse(DGX_LIKE, "dgx.xml").unwrap();
    Topology::from_parts(
        host,
        vec![
            gpu(0, "0000:1b:00.0", &[1, 2, 3]),
            gpu(1, "0000:1c:00.0", &[0, 2, 3]),
            gpu(2, "0000:8b:00.0", &[0, 1, 3]),
            gpu(3, "0000:8c:00.0", &[0, 1, 2]),
            gpu(4, "0000:8c:00.0", &[]),
            host_device(0),
            host_device(1),
        ],
    )
}

#[test]
fn uncalibrated_reductions_are_estimated_by_kind() {
    let mut t = dgx();
    let gbps = |t: &Topology, i: usize| 1.0 / (t.reduce_beta(i) * 1e3);
    assert!((gbps(&t, 0) - GPU_REDUCE_GBPS).abs() < 1e-9);
    // A host device: its own copy (the class estimate) slowed by half.
    let copy = t.link(5, 5).unwrap().bandwidth_gbps;
    assert!((gbps(&t, 5) - copy / 1.5).abs() < 1e-9);
    // A measured figure wins.
    t.devices[0].reduce_gbps = Some(0.25);
    assert!((gbps(&t, 0) - 0.25).abs() < 1e-9);
}

#[test]
fn nccl_file_is_read() {
    let host = nccl_xml::parse(DGX_LIKE, "dgx.xml").unwrap();
    assert_eq!(host.numa_nodes.len(), 2);
    assert_eq!(host.pci.len(), 6);
    let g = host.pci_device("0000:8b:00.0").unwrap();
    assert_eq!(g.numa_node, Some(1));
    assert_eq!(
        g.bridges,
        vec!["hostbridge:1".to_string(), "0000:8a:00.0".into()]
    );
    assert_eq!(g.class, 0x0302);
    assert_eq!(host.links.len(), 2);
    assert_eq!(host.links[0].count, 18);
    let switch = host.pci_device("0000:1a:00.0").unwrap();
    assert!(
        (switch.link_speed_gbps - 31.5).abs() < 0.1,
        "{}",
        switch.link_speed_gbps
    );
}

#[test]
fn pairs_are_classified() {
    let t = dgx();
    let class = |a, b| t.link(a, b).unwrap().class;
    assert_eq!(class(0, 0), LinkClass::SameDevice);
    assert_eq!(class(0, 1), LinkClass::DirectLink);
    assert_eq!(class(1, 0), LinkClass::DirectLink);
    assert_eq!(class(2, 3), LinkClass::PcieSwitch);
    assert_eq!(class(0, 2), LinkClass::CrossSocket);
    assert_eq!(class(4, 3), LinkClass::HostStaged, "no peer access");
    assert_eq!(class(5, 6), LinkClass::SharedMemory);
    assert_eq!(class(5, 0), LinkClass::HostStaged, "different backends");
    // 18 links are modelled faster than one.
    assert!(t.link(0, 1).unwrap().bandwidth_gbps > t.link(2, 3).unwrap().bandwidth_gbps);
    assert_eq!(
        t.devices[2].numa_node,
        Some(1),
        "NUMA node from the PCI tree"
    );
    assert!(t.link(7, 0).is_err());
}

#[test]
fn devices_of_other_processes_and_machines_are_classified_by_both() {
    // host:0 and host:1 in process 0; host:0 in process 1 on the same machine; host:0
    // in process 2 on another machine.
    let mut devices = vec![
        host_device(0),
        host_device(1),
        host_device(0),
        host_device(0),
    ];
    for (d, (process, node)) in devices.iter_mut().zip([(0, 0), (0, 0), (1, 0), (2, 1)]) {
        d.process = process;
        d.node = node;
    }
    let host = nccl_xml::parse(DGX_LIKE, "dgx.xml").unwrap();
    let t = Topology::from_parts(host, devices);
    let class = |a, b| t.link(a, b).unwrap().class;
    assert_eq!(class(0, 1), LinkClass::SharedMemory);
    assert_eq!(
        class(0, 2),
        LinkClass::CrossProcess,
        "same id, other process"
    );
    assert_eq!(class(2, 3), LinkClass::Network);
    assert_eq!(class(3, 0), LinkClass::Network);
    assert_eq!(class(2, 2), LinkClass::SameDevice);
    assert_eq!(t.groups(), vec![vec![0, 1], vec![2], vec![3]]);
}

#[test]
fn same_numa_without_switch_is_host_bridge() {
    let text = r#"<system version="1"><cpu numaid="0">
        <pci busid="0000:01:00.0" class="0x030200"/>
        <pci busid="0000:02:00.0" class="0x030200"/>
    </cpu></system>"#;
    let host = nccl_xml::parse(text, "flat.xml").unwrap();
    let t = Topology::from_parts(host, vec![gpu(0, "01:00.0", &[1]), gpu(1, "02:00.0", &[0])]);
    assert_eq!(t.link(0, 1).unwrap().class, LinkClass::PcieHostBridge);
}

#[test]
fn groups_follow_close_links() {
    let t = dgx();
    // GPUs 0-3 are all peer-connected (the cross-socket pair is not close, so 0/1 and 2/3
    // split), GPU 4 has no peers, the host devices share memory.
    assert_eq!(
        t.groups(),
        vec![vec![0, 1], vec![2, 3], vec![4], vec![5, 6]]
    );
    assert_eq!(t.slowest_link().unwrap().class, LinkClass::HostStaged);
}

#[test]
fn written_xml_reads_back() {
    let t = dgx();
    let xml = nccl_xml::write(&t).unwrap();
    let back = nccl_xml::parse(&xml, "written").unwrap();
    for d in t.devices.iter().filter_map(|d| d.pci_bus_id.as_deref()) {
        let (a, b) = (t.host.pci_device(d).unwrap(), back.pci_device(d).unwrap());
        assert_eq!(a.bridges, b.bridges, "{d}");
        assert_eq!(a.numa_node, b.numa_node, "{d}");
    }
    assert_eq!(back.links, t.host.links);
    let again = Topology::from_parts(back, t.devices.clone());
    for a in 0..t.len() {
        for b in 0..t.len() {
            assert_eq!(t.link(a, b).unwrap().class, again.link(a, b).unwrap().class);
        }
    }
}

#[test]
fn bad_files_are_refused_with_reasons() {
    for (text, wanted) in [
        (
            "<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"zz\"/></cpu></system>",
            "not a PCI address",
        ),
        ("<system version=\"1\"></system>", "no <cpu>"),
        ("<other/>", "not <system>"),
        ("<system><cpu>", "not closed"),
        ("", "not <system>"),
    ] {
        let e = nccl_xml::parse(text, "t.xml").unwrap_err().to_string();
        assert!(e.contains(wanted) && e.contains("t.xml"), "{text}: {e}");
    }
    // A million nested bridges: refused at the depth limit, without exhausting the
    // stack or memory.
    let deep = format!(
        "<system version=\"1\"><cpu numaid=\"0\">{}{}</cpu></system>",
        "<pci busid=\"0000:01:00.0\">".repeat(1_000_000),
        "</pci>".repeat(1_000_000)
    );
    let e = nccl_xml::parse(&deep, "deep.xml").unwrap_err().to_string();
    assert!(e.contains("nest more than"), "{e}");
    // A nesting as deep as allowed still reads.
    let depth = 60;
    let ok = format!(
        "<system version=\"1\"><cpu numaid=\"0\">{}{}</cpu></system>",
        "<pci busid=\"0000:01:00.0\">".repeat(depth),
        "</pci>".repeat(depth)
    );
    assert!(nccl_xml::parse(&ok, "ok.xml").is_ok());
}

#[test]
fn real_devices_are_discovered_and_calibrated() {
    let registry = {
        let mut r = xpu_hal::Registry::new();
        r.register(std::sync::Arc::new(xpu_host::HostBackend::new(
            xpu_host::HostConfig {
                devices: 2,
                capacity: 64 << 20,
            },
        )))
        .unwrap();
        r
    };
    let devices: Vec<Device> = registry
        .devices(&xpu_hal::DeviceSelector::parse("host:*").unwrap())
        .unwrap();
    let mut t = Topology::discover(&devices).unwrap();
    assert_eq!(t.link(0, 1).unwrap().class, LinkClass::SharedMemory);
    assert!(!t.link(0, 1).unwrap().measured);
    let options = calibrate::CalibrationOptions {
        bytes: 1 << 16,
        repetitions: 3,
    };
    let measured = calibrate::calibrate(&mut t, &devices, options).unwrap();
    assert_eq!(measured.links.len(), 4);
    assert!(t.link(0, 1).unwrap().measured);
    assert!(measured
        .links
        .iter()
        .all(|m| m.bandwidth_gbps > 0.0 && m.latency_us > 0.0));
    // Each device's reduction, measured and kept in the topology.
    assert_eq!(measured.reductions.len(), 2);
    assert!(t
        .devices
        .iter()
        .all(|d| d.reduce_gbps.is_some_and(|g| g > 0.0)));

    let dir = std::env::temp_dir().join(format!("xpu-topo-test-{}", std::process::id()));
    let path = dir.join("cache.json");
    calibrate::store(&path, &t, &measured).unwrap();
    let mut fresh = Topology::discover(&devices).unwrap();
    let cache = calibrate::load_cache(&path).unwrap();
    assert_eq!(calibrate::apply_cached(&mut fresh, &cache).unwrap(), 4);
    let (got, want) = (fresh.devices[1].reduce_gbps, t.devices[1].reduce_gbps);
    assert!(
        matches!((got, want), (Some(g), Some(w)) if (g - w).abs() <= 1e-9 * w),
        "{got:?} against {want:?}"
    );
    let (a, b) = (fresh.link(1, 0).unwrap(), t.link(1, 0).unwrap());
    assert_eq!((a.class, a.measured), (b.class, b.measured));
    // JSON keeps the figures to within the last bit.
    assert!((a.bandwidth_gbps - b.bandwidth_gbps).abs() <= 1e-9 * b.bandwidth_gbps);
    assert!((a.latency_us - b.latency_us).abs() <= 1e-9 * b.latency_us);
    let _ = std::fs::remove_dir_all(dir);

    // Calibrating other devices than the topology's is refused.
    assert!(calibrate::calibrate(&mut t, &devices[..1], options).is_err());
}
