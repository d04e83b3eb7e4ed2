//! What the benches share: the eBPF object loaded (not attached) with its maps pinned under
//! a unique `/sys/fs/bpf/<tag>` (removed on drop) and sized for the bench, synthetic service
//! models, and the agent's sync path (`reconcile::recompute` + `sync::apply`) into those maps.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray},
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
};
use lb_common::{
    ALL_MAPS, BACKEND_MAP_CAPACITY, Backend, Counter, CtKey, CtKey6, CtValue, CtValue6, FilterSize,
    GLOBAL_FILTER_LOG2, MAP_ADDR_FILTER, MAP_BACKEND, MAP_BACKEND_STATS, MAP_CT, MAP_CT_ASSURED,
    MAP_CT6, MAP_CT6_ASSURED, MAP_SLOT, MAP_STATS, MAP_SVC, MAP_SVC_STATS, SVC_NAME_MAP_CAPACITY,
    SvcKey, SvcValue,
};
use lb_userspace::{
    datapath::{
        kernel::KernelMaps,
        loader,
        rows::{self, Strides},
        sync::{self, apply},
    },
    desired::{Desired, NodeContext},
    model::{Model, ServiceRef},
    reconcile::{self, Ids, Incremental},
    source::file,
};
use xlb_tests::{
    services::{service_on_nodes, service_yaml},
    unique_tag,
};

/// The real tc program.
pub const PROG_INGRESS: &str = "xlb_tc_ingress";
/// The real tc egress program.
pub const PROG_EGRESS: &str = "xlb_tc_egress";
/// The bench-only program that only passes (the floor).
pub const PROG_PASS: &str = "xlb_tc_pass";
/// The real XDP program.
pub const PROG_XDP: &str = "xlb_xdp";
/// The bench-only XDP program that only passes (XDP's floor).
pub const PROG_XDP_PASS: &str = "xlb_xdp_pass";

/// The first ClusterIP of the synthetic services (service `i` has `VIP_BASE + i`).
pub const VIP_BASE: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 0);
/// The first backend address (service `i`'s backend `k` is `BACKEND_BASE + 16 i + k`).
pub const BACKEND_BASE: Ipv4Addr = Ipv4Addr::new(10, 128, 0, 0);
/// Service port and backend (target) port of the synthetic services.
pub const SVC_PORT: u16 = 80;
pub const TARGET_PORT: u16 = 8080;

/// `base + n` as an address.
pub fn addr_add(base: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base).wrapping_add(n))
}

/// ClusterIP of synthetic service `i`.
pub fn vip(i: usize) -> Ipv4Addr {
    addr_add(VIP_BASE, i as u32)
}

/// Backend `k` of synthetic service `i` (k < 16).
pub fn backend_ip(i: usize, k: usize) -> Ipv4Addr {
    addr_add(BACKEND_BASE, (i * 16 + k) as u32)
}

/// Map capacities to load with (`None`: the object's default).
#[derive(Clone, Copy, Debug, Default)]
pub struct Capacities {
    pub svc: Option<u32>,
    /// The slot array (every frontend's range, a power of two each).
    pub slots: Option<u32>,
    pub backends: Option<u32>,
    /// The name and per-service counter maps (one entry per service port each).
    pub per_service: Option<u32>,
    pub ct: Option<u32>,
}

impl Capacities {
    /// Room for `services` service ports with `slots` backend slots and backends in total
    /// (a frontend's range is at most twice its slots).
    pub fn for_services(services: usize, slots: usize) -> Self {
        let pow2 = |n: usize| (n.max(1024) as u32).next_power_of_two();
        Self {
            svc: Some(pow2(services + 64)),
            slots: Some(pow2(2 * slots + 64).max(lb_common::SLOT_MAP_CAPACITY)),
            backends: Some(pow2(slots + 64)),
            per_service: Some(pow2(services + 64)),
            ct: None,
        }
    }
}

/// The object loaded with both programs, its pinned maps and the agent's view of them.
pub struct Datapath {
    ebpf: Ebpf,
    pub maps: KernelMaps,
    ct: HashMap<MapData, CtKey, CtValue>,
    cta: HashMap<MapData, CtKey, CtValue>,
    /// The IPv6 conntrack tables (LRU and assured).
    ct6: [HashMap<MapData, CtKey6, CtValue6>; 2],
    stats: PerCpuArray<MapData, Counter>,
    pub pins: PathBuf,
    current: Desired,
    ids: Ids,
    /// The agent's incremental desired state (for [`Datapath::program_incremental`]).
    engine: Incremental,
}

/// What one sync did and how long its parts took.
#[derive(Clone, Copy, Debug)]
pub struct SyncTiming {
    pub compute: Duration,
    pub apply: Duration,
    /// Map writes and deletes the sync made.
    pub writes: usize,
    pub deletes: usize,
}

/// One `BPF_PROG_TEST_RUN`: verdict, the kernel's per-run average duration, output packet.
pub struct Run {
    pub verdict: u32,
    pub duration: Duration,
    pub packet: Vec<u8>,
}

impl Datapath {
    /// Loads the object `cargo xtask build-ebpf` left on disk (not the one embedded in this
    /// binary, which may predate it) with `caps`, pins under `/sys/fs/bpf/<tag>`.
    pub fn load(caps: Capacities) -> Result<Self> {
        let pins = PathBuf::from(format!("/sys/fs/bpf/{}", unique_tag("xlbb")));
        loader::ensure_pin_dir(&pins).map_err(|e| anyhow!("{e}"))?;
        // From here on a failure must still remove the pins.
        let mut guard = PinGuard(Some(pins.clone()));
        // Another build of lb-ebpf (`XLB_BENCH_OBJECT`), to hold two builds side by side.
        let object = std::env::var_os("XLB_BENCH_OBJECT")
            .map(PathBuf::from)
            .unwrap_or_else(crate::build::ebpf_object);
        let paths: Vec<(&str, PathBuf)> = ALL_MAPS.iter().map(|m| (*m, pins.join(m))).collect();
        let cpus = rows::cpus().map_err(|e| anyhow!("{e}"))?;
        let svc_stride = caps.per_service.unwrap_or(SVC_NAME_MAP_CAPACITY);
        let backend_stride = caps.backends.unwrap_or(BACKEND_MAP_CAPACITY);
        // Sized as the agent sizes it; an object of a build before sized filters (no such
        // global) reads the default size.
        let sized = std::fs::read(&object)
            .with_context(|| format!("reading {}", object.display()))?
            .windows(GLOBAL_FILTER_LOG2.len())
            .any(|w| w == GLOBAL_FILTER_LOG2.as_bytes());
        let filter = match sized {
            true => FilterSize::for_maps(svc_stride, backend_stride),
            false => FilterSize::DEFAULT,
        };
        let strides = Strides {
            svc: svc_stride,
            backend: backend_stride,
            filter_log2: if sized { filter.global() } else { 0 },
        };
        // As the agent: counter arrays this load creates start at zero.
        let counters_pinned = loader::counters_pinned(&pins);
        let mut l = EbpfLoader::new();
        for (name, path) in &paths {
            l.map_pin_path(name, path.as_path());
        }
        strides.set(&mut l);
        let sizes = [
            (MAP_SVC, caps.svc),
            (MAP_SLOT, caps.slots),
            (MAP_BACKEND, caps.backends),
            (MAP_SVC_STATS, Some(rows::entries(strides.svc, cpus))),
            (
                MAP_BACKEND_STATS,
                Some(rows::entries(strides.backend, cpus)),
            ),
            (MAP_CT, caps.ct),
            (MAP_CT_ASSURED, caps.ct),
            (MAP_ADDR_FILTER, Some(filter.entries())),
        ];
        for (name, size) in sizes {
            if let Some(size) = size {
                l.map_max_entries(name, size);
            }
        }
        let mut ebpf = l
            .load_file(&object)
            .with_context(|| format!("loading {}", object.display()))?;
        for name in [PROG_INGRESS, PROG_EGRESS, PROG_PASS] {
            program(&mut ebpf, name)?
                .load()
                .with_context(|| format!("loading program {name}"))?;
        }
        for name in [PROG_XDP, PROG_XDP_PASS] {
            xdp_program(&mut ebpf, name)?
                .load()
                .with_context(|| format!("loading program {name}"))?;
        }
        let mut maps = KernelMaps::from_ebpf(&mut ebpf, &pins).map_err(|e| anyhow!("{e}"))?;
        if !counters_pinned {
            maps.counters_created();
        }
        let ct_map = ebpf
            .take_map(MAP_CT)
            .ok_or_else(|| anyhow!("{MAP_CT} missing"))?;
        let ct = HashMap::try_from(ct_map).context("conntrack map")?;
        let cta_map = ebpf
            .take_map(MAP_CT_ASSURED)
            .ok_or_else(|| anyhow!("{MAP_CT_ASSURED} missing"))?;
        let cta = HashMap::try_from(cta_map).context("assured conntrack map")?;
        let mut ct6 = Vec::new();
        for name in [MAP_CT6, MAP_CT6_ASSURED] {
            let map = ebpf
                .take_map(name)
                .ok_or_else(|| anyhow!("{name} missing"))?;
            ct6.push(HashMap::try_from(map).with_context(|| name.to_string())?);
        }
        let ct6: [_; 2] = ct6
            .try_into()
            .map_err(|_| anyhow!("two IPv6 conntrack tables"))?;
        let stats_map = ebpf
            .take_map(MAP_STATS)
            .ok_or_else(|| anyhow!("{MAP_STATS} missing"))?;
        let stats = PerCpuArray::try_from(stats_map).context("counters map")?;
        guard.0 = None;
        Ok(Self {
            ebpf,
            maps,
            ct,
            cta,
            ct6,
            stats,
            pins,
            current: Desired::default(),
            ids: Ids::default(),
            engine: Incremental::default(),
        })
    }

    /// Programs the maps for `model` the way the agent does (`reconcile::recompute` on the whole
    /// model, then the make-before-break `sync::apply` diff against what is programmed).
    pub fn program(&mut self, model: &Model) -> Result<SyncTiming> {
        self.program_on(model, &NodeContext::default())
    }

    /// [`Datapath::program`] as a node `node` (its settings: `--lb-algorithm`, the NodePort
    /// addresses).
    pub fn program_on(&mut self, model: &Model, node: &NodeContext) -> Result<SyncTiming> {
        let t0 = Instant::now();
        let (want, problems) = reconcile::recompute(model, node, &mut self.ids, self.maps.limits());
        let t1 = Instant::now();
        let (now, report) = apply(&mut self.maps, &self.current, &want);
        let t2 = Instant::now();
        self.current = now;
        if let Some(p) = problems.first() {
            bail!("desired state: {p} ({} problems)", problems.len());
        }
        if let Some(e) = report.errors.first() {
            bail!("sync: {e} ({} errors)", report.errors.len());
        }
        Ok(SyncTiming {
            compute: t1 - t0,
            apply: t2 - t1,
            writes: report.writes,
            deletes: report.deletes,
        })
    }

    /// Programs the maps the way the agent does now: a full computation of the incremental
    /// state (`full`, as at start), or only the services in `changed` recomputed and only
    /// what they touched written (`reconcile::Incremental::update`, `sync::apply_touched`).
    pub fn program_incremental(
        &mut self,
        model: &Model,
        full: bool,
        changed: impl IntoIterator<Item = ServiceRef>,
    ) -> Result<SyncTiming> {
        let node = NodeContext::default();
        let limits = self.maps.limits();
        let t0 = Instant::now();
        // As the agent: no programmed copy; a full computation applies against the state it
        // replaces (or what `program` left), an update against the journal of its changes.
        let (touched, mut now) = if full {
            let replaced = self.engine.full(model, &node, &mut self.ids, limits);
            let now = match std::mem::take(&mut self.current) {
                c if c == Desired::default() => replaced,
                c => c,
            };
            (sync::everything(&now, self.engine.desired()), now)
        } else {
            let touched = self
                .engine
                .update(model, &node, &mut self.ids, limits, changed);
            let now = self.engine.programmed_before(&touched);
            (touched, now)
        };
        let t1 = Instant::now();
        let report = match full && now.is_empty() {
            true => sync::apply_fresh(&mut self.maps, self.engine.desired(), &touched),
            false => sync::apply_touched(&mut self.maps, &mut now, self.engine.desired(), &touched),
        };
        let t2 = Instant::now();
        drop(now);
        if let Some(e) = report.errors.first() {
            bail!("sync: {e} ({} errors)", report.errors.len());
        }
        Ok(SyncTiming {
            compute: t1 - t0,
            apply: t2 - t1,
            writes: report.writes,
            deletes: report.deletes,
        })
    }

    /// What the agent believes is programmed (after `program_incremental`: its desired
    /// state).
    pub fn current(&self) -> &Desired {
        if self.current == Desired::default() {
            self.engine.desired()
        } else {
            &self.current
        }
    }

    /// Runs program `prog` on `packet` `repeat` times (BPF_PROG_TEST_RUN).
    pub fn run(&mut self, prog: &str, packet: &[u8], repeat: u32) -> Result<Run> {
        let p = program(&mut self.ebpf, prog)?;
        let mut out = vec![0u8; packet.len() + 256];
        let opts = TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        };
        let r = p
            .test_run(opts)
            .with_context(|| format!("BPF_PROG_TEST_RUN of {prog}"))?;
        out.truncate(r.data_size_out as usize);
        Ok(Run {
            verdict: r.return_value,
            duration: r.duration,
            packet: out,
        })
    }

    /// Runs XDP program `prog` on `packet` `repeat` times as received on `ifindex` (of the
    /// calling thread's network namespace).
    pub fn run_xdp(&mut self, prog: &str, packet: &[u8], repeat: u32, ifindex: u32) -> Result<Run> {
        let p = xdp_program(&mut self.ebpf, prog)?;
        let mut out = vec![0u8; packet.len() + 256];
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        // data_end is the frame's length: with 0 the kernel hands the program a frame whose
        // bytes are not directly accessible, and every read and write of it goes through
        // bpf_xdp_load_bytes/store_bytes (a path real traffic never takes).
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
        let opts = TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            repeat,
            ..TestRunOptions::default()
        };
        let r = p
            .test_run(opts)
            .with_context(|| format!("BPF_PROG_TEST_RUN of {prog}"))?;
        out.truncate(r.data_size_out as usize);
        Ok(Run {
            verdict: r.return_value,
            duration: r.duration,
            packet: out,
        })
    }

    /// Writes the node configuration as the agent would for this namespace's routing
    /// (`datapath::routing`: the families whose routes depend on the destination alone, where
    /// XDP keeps the way out per backend), the rest zero as without an agent; returns the
    /// flags. An older object (`XLB_BENCH_OBJECT`) ignores them.
    pub fn configure_routing(&mut self) -> Result<u32> {
        let cfg = lb_common::NodeConfig {
            flags: lb_userspace::datapath::routing::by_destination(),
            ..Default::default()
        };
        lb_userspace::datapath::kernel::write_config(&mut self.ebpf, &cfg)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(cfg.flags)
    }

    /// Deletes every conntrack entry.
    pub fn clear_ct(&mut self) -> Result<()> {
        for table in [&mut self.ct, &mut self.cta] {
            let keys: Vec<CtKey> = table.keys().collect::<Result<_, _>>()?;
            for k in keys {
                table.remove(&k).context("delete conntrack entry")?;
            }
        }
        for table in &mut self.ct6 {
            let keys: Vec<CtKey6> = table.keys().collect::<Result<_, _>>()?;
            for k in keys {
                table.remove(&k).context("delete IPv6 conntrack entry")?;
            }
        }
        Ok(())
    }

    /// Packets counted under reason code `reason` (`lb_common::R_*`), over all CPUs.
    pub fn reason_count(&self, reason: u32) -> Result<u64> {
        let per_cpu = self.stats.get(&reason, 0).context("read counters")?;
        Ok(per_cpu.iter().map(|c| c.packets).sum())
    }
}

impl Drop for Datapath {
    fn drop(&mut self) {
        let _ = lb_userspace::cleanup::cleanup(&self.pins);
    }
}

/// Removes a pin directory on drop (used until [`Datapath`] owns it).
struct PinGuard(Option<PathBuf>);

impl Drop for PinGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = lb_userspace::cleanup::cleanup(&p);
        }
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} is not in the object (rebuild lb-ebpf)"))?;
    p.try_into()
        .with_context(|| format!("{name} is not a tc program"))
}

fn xdp_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} is not in the object (rebuild lb-ebpf)"))?;
    p.try_into()
        .with_context(|| format!("{name} is not an XDP program"))
}

/// Backends of synthetic service `i`: 2 to 10, cycling.
pub fn backends_2_to_10(i: usize) -> usize {
    2 + i % 9
}

/// YAML (Service + EndpointSlice) of synthetic services `range`, service `i` with
/// `backends(i)` ready endpoints on port [`TARGET_PORT`], each with its own addresses.
pub fn services_yaml(range: std::ops::Range<usize>, backends: impl Fn(usize) -> usize) -> String {
    protocol_services_yaml("TCP", range, backends)
}

/// [`services_yaml`] of `protocol` (`TCP`, `UDP`, `SCTP`): service `i` on TCP service
/// `i`'s ClusterIP and backends, named after the protocol so both can be in one model.
pub fn protocol_services_yaml(
    protocol: &str,
    range: std::ops::Range<usize>,
    backends: impl Fn(usize) -> usize,
) -> String {
    let prefix = if protocol == "TCP" {
        "s".to_string()
    } else {
        protocol.to_lowercase()
    };
    let mut y = String::new();
    for i in range {
        let bes: Vec<Ipv4Addr> = (0..backends(i)).map(|k| backend_ip(i, k)).collect();
        y.push_str(&service_yaml(
            &format!("{prefix}{i}"),
            vip(i),
            SVC_PORT,
            protocol,
            TARGET_PORT,
            &bes,
        ));
    }
    y
}

/// The first externalIP of the synthetic external services (service `i`'s `j`th of `k`
/// is `EXTERNAL_BASE + k i + j`).
pub const EXTERNAL_BASE: Ipv4Addr = Ipv4Addr::new(172, 16, 0, 0);

/// YAML of synthetic services `range` with `externals` externalIPs each (frontends reached
/// from outside the cluster, which `--lb-algorithm maglev` gives a Maglev table; a
/// service's share one, having the same backends): service `i` on ClusterIP [`vip`]`(i)`,
/// port [`SVC_PORT`], with `backends` ready endpoints of its own.
pub fn external_services_yaml(
    range: std::ops::Range<usize>,
    backends: usize,
    externals: usize,
) -> String {
    let mut y = String::new();
    for i in range {
        let ips: Vec<String> = (0..externals)
            .map(|j| {
                format!(
                    "\"{}\"",
                    addr_add(EXTERNAL_BASE, (i * externals + j) as u32)
                )
            })
            .collect();
        let endpoints: Vec<(Ipv4Addr, &str)> =
            (0..backends).map(|k| (backend_ip(i, k), "node1")).collect();
        y.push_str(&service_on_nodes(
            &format!("e{i}"),
            "ClusterIP",
            &vip(i).to_string(),
            "TCP",
            SVC_PORT,
            TARGET_PORT,
            None,
            &format!("  externalIPs: [{}]\n", ips.join(", ")),
            "",
            &endpoints,
        ));
    }
    y
}

/// Parses service YAML through the agent's file source into a model.
pub fn parse_model(yaml: &str) -> Result<Model> {
    let loaded = file::parse("bench.yaml", yaml).map_err(|e| anyhow!("{e}"))?;
    if let Some(e) = loaded.errors.first() {
        bail!("bench YAML: {e}");
    }
    Ok(loaded.model)
}

/// A model of synthetic services `0..n`, parsed in chunks (the agent's file source).
pub fn model(n: usize, backends: impl Fn(usize) -> usize + Copy) -> Result<Model> {
    let mut m = Model::default();
    extend_model(&mut m, 0..n, backends)?;
    Ok(m)
}

/// Adds synthetic services `range` to `m`.
pub fn extend_model(
    m: &mut Model,
    range: std::ops::Range<usize>,
    backends: impl Fn(usize) -> usize + Copy,
) -> Result<()> {
    const CHUNK: usize = 5_000;
    let mut start = range.start;
    while start < range.end {
        let end = (start + CHUNK).min(range.end);
        let part = parse_model(&services_yaml(start..end, backends))?;
        m.services.extend(part.services);
        m.slices.extend(part.slices);
        start = end;
    }
    Ok(())
}

/// The service map key of a frontend.
pub fn svc_key(vip: Ipv4Addr, port: u16) -> SvcKey {
    lb_common::user::frontend_key(vip, port, lb_userspace::model::Protocol::Tcp)
}

/// Reads one service map entry from pinned maps (a probe of what the datapath sees).
pub struct Probe {
    svc: HashMap<MapData, SvcKey, SvcValue>,
    slots: Array<MapData, u32>,
    backends: HashMap<MapData, u32, Backend>,
}

impl Probe {
    /// Opens the pinned service and backend maps in `pins`.
    pub fn open(pins: &std::path::Path) -> Result<Self> {
        let open = |name: &'static str| -> Result<MapData> {
            MapData::from_pin(pins.join(name)).with_context(|| format!("open pinned {name}"))
        };
        Ok(Self {
            svc: HashMap::try_from(aya::maps::Map::HashMap(open(MAP_SVC)?))?,
            slots: Array::try_from(aya::maps::Map::Array(open(MAP_SLOT)?))?,
            backends: HashMap::try_from(aya::maps::Map::HashMap(open(MAP_BACKEND)?))?,
        })
    }

    /// The backends the datapath would pick from for `vip:port`, as the maps hold them now.
    pub fn backends(&self, vip: Ipv4Addr, port: u16) -> Result<Vec<SocketAddrV4>> {
        let entry = self.svc.get(&svc_key(vip, port), 0)?;
        let mut out = Vec::new();
        for i in 0..entry.count as u32 {
            let id = self.slots.get(&(entry.slot_base + i), 0)?;
            let b = self.backends.get(&id, 0)?;
            out.push(SocketAddrV4::new(
                Ipv4Addr::from(b.addr_be[0].to_ne_bytes()),
                u16::from_be(b.port_be),
            ));
        }
        Ok(out)
    }
}

/// `/proc/self/status` field in kB (`VmRSS`, `VmHWM`).
pub fn status_kb(pid: &str, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("{field} missing in /proc/{pid}/status"))
}

/// Returns freed heap to the kernel (glibc `malloc_trim`), then resets this process's peak
/// RSS (VmHWM) to its current RSS (`/proc/self/clear_refs` 5), so the next VmHWM − VmRSS is
/// what the code in between added at its peak.
pub fn reset_peak_rss() -> Result<()> {
    unsafe extern "C" {
        fn malloc_trim(pad: usize) -> i32;
    }
    // SAFETY: glibc's malloc_trim has no preconditions.
    unsafe { malloc_trim(0) };
    std::fs::write("/proc/self/clear_refs", "5").context("reset VmHWM")
}
