//! The datapath loaded into the kernel (not attached) with its own pin directory, for packet
//! tests through `BPF_PROG_TEST_RUN`. Pins are removed on drop.

use std::path::PathBuf;

use aya::programs::{TestRun, TestRunOptions};
use lb_userspace::{
    EBPF_OBJECT,
    datapath::{kernel::KernelMaps, loader, sync::apply, writer::MapWriter},
    desired::{self, Desired},
    model::Model,
    reconcile::{self, Ids},
};

/// A loaded object and its maps.
pub struct LoadedDatapath {
    pub ebpf: aya::Ebpf,
    pub maps: KernelMaps,
    pub pins: PathBuf,
    current: Desired,
    ids: Ids,
}

/// The verdict and the packet as the program left it.
#[derive(Debug)]
pub struct RunResult {
    pub verdict: u32,
    pub packet: Vec<u8>,
}

impl LoadedDatapath {
    /// Loads the embedded object with pins under a fresh directory named after `tag`.
    pub fn load(tag: &str) -> Result<Self, String> {
        Self::load_sized(tag, &lb_userspace::datapath::sizes::MapSizes::default())
    }

    /// [`LoadedDatapath::load`] with other map sizes.
    pub fn load_sized(
        tag: &str,
        sizes: &lb_userspace::datapath::sizes::MapSizes,
    ) -> Result<Self, String> {
        let pins = PathBuf::from(format!("/sys/fs/bpf/{tag}"));
        // A failed load (a verifier refusal) may have pinned maps already: remove them too.
        let fail = |e: String| {
            let _ = lb_userspace::cleanup::cleanup(&pins);
            e
        };
        let mut ebpf = loader::load(EBPF_OBJECT, &pins, sizes).map_err(|e| fail(chain(&e)))?;
        let maps = KernelMaps::from_ebpf(&mut ebpf, &pins).map_err(|e| fail(chain(&e)))?;
        Ok(Self {
            ebpf,
            maps,
            pins,
            current: Desired::default(),
            ids: Ids::default(),
        })
    }

    /// Programs the maps for `model`, as the agent would.
    pub fn program(&mut self, model: &Model) -> Result<(), String> {
        self.program_on(model, &desired::NodeContext::default())
    }

    /// Programs the maps for `model` as the agent on `node` would (local endpoints, NodePort
    /// addresses).
    pub fn program_on(&mut self, model: &Model, node: &desired::NodeContext) -> Result<(), String> {
        let (want, _) = reconcile::recompute(model, node, &mut self.ids, self.maps.limits());
        let (now, report) = apply(&mut self.maps, &self.current, &want);
        self.current = now;
        match report.errors.first() {
            Some(e) => Err(e.to_string()),
            None => Ok(()),
        }
    }

    /// Writes the node configuration (SNAT ports, hairpin address), as the agent does at start.
    pub fn configure(&mut self, cfg: &lb_common::NodeConfig) -> Result<(), String> {
        lb_userspace::datapath::kernel::write_config(&mut self.ebpf, cfg).map_err(|e| chain(&e))
    }

    /// What the maps hold now.
    pub fn state(&self) -> Desired {
        self.maps.read().unwrap_or_default()
    }

    /// Runs `packet` through the node as tc sees it: tc ingress, then (when ingress passed
    /// it) tc egress on what ingress left, as a packet that enters by one attached
    /// interface and leaves by another. `Err` when the kernel refuses the input.
    pub fn run(&mut self, packet: &[u8]) -> Result<RunResult, String> {
        let r = self.run_ingress(packet)?;
        if r.verdict != TC_ACT_OK {
            return Ok(r);
        }
        self.run_egress(&r.packet)
    }

    /// Runs tc ingress alone once on `packet`.
    pub fn run_ingress(&mut self, packet: &[u8]) -> Result<RunResult, String> {
        let prog = loader::tc_program(&mut self.ebpf).map_err(|e| chain(&e))?;
        test_run(prog, packet)
    }

    /// Runs tc egress alone once on `packet`.
    pub fn run_egress(&mut self, packet: &[u8]) -> Result<RunResult, String> {
        let prog = loader::tc_egress_program(&mut self.ebpf).map_err(|e| chain(&e))?;
        test_run(prog, packet)
    }
}

pub use lb_userspace::datapath::chain;

/// The service map key of a frontend no Service has (203.0.113.1:`port`/TCP): an entry
/// another writer left, to take room in the map (no test traffic goes there).
pub fn foreign_frontend(port: u16) -> lb_common::SvcKey {
    lb_common::SvcKey {
        addr_be: [u32::from_ne_bytes([203, 0, 113, 1]), 0, 0, 0],
        port_be: port.to_be(),
        proto: libc::IPPROTO_TCP as u8,
        family: lb_common::FAMILY_V4,
        scope: 0,
        _pad0: 0,
        _pad1: 0,
    }
}

/// tc's TC_ACT_OK: the packet goes on.
const TC_ACT_OK: u32 = 0;

/// `BPF_PROG_TEST_RUN` of a tc program on `packet`.
fn test_run(prog: &mut aya::programs::SchedClassifier, packet: &[u8]) -> Result<RunResult, String> {
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ..TestRunOptions::default()
    };
    let r = prog.test_run(opts).map_err(|e| chain(&e))?;
    out.truncate(r.data_size_out as usize);
    Ok(RunResult {
        verdict: r.return_value,
        packet: out,
    })
}

impl LoadedDatapath {
    /// Runs the XDP program once on `packet` as received on interface `ingress_ifindex` (of
    /// the calling thread's namespace).
    pub fn run_xdp(&mut self, packet: &[u8], ingress_ifindex: u32) -> Result<RunResult, String> {
        let prog = loader::xdp_program(&mut self.ebpf).map_err(|e| chain(&e))?;
        let mut out = vec![0u8; packet.len() + 256];
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex.
        // data_end is the frame's length: with 0 the kernel hands the program a frame whose
        // bytes are not directly accessible, and every read and write of it goes through
        // bpf_xdp_load_bytes/store_bytes (a path real traffic never takes).
        let mut ctx = [0u8; 24];
        ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
        ctx[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
        let opts = TestRunOptions {
            data_in: Some(packet),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        };
        let r = prog.test_run(opts).map_err(|e| chain(&e))?;
        out.truncate(r.data_size_out as usize);
        Ok(RunResult {
            verdict: r.return_value,
            packet: out,
        })
    }

    /// Lets XDP redirect to interface `ifindex` (as the agent does where it attached XDP).
    pub fn allow_xdp_redirect(&mut self, ifindex: u32) -> Result<(), String> {
        let map = self
            .ebpf
            .map_mut(lb_common::MAP_XDP_TX)
            .ok_or("XDP redirect map missing")?;
        let mut tx: aya::maps::DevMapHash<&mut aya::maps::MapData> =
            aya::maps::DevMapHash::try_from(map).map_err(|e| chain(&e))?;
        tx.insert(ifindex, ifindex, None, 0).map_err(|e| chain(&e))
    }
}

/// The datapath's packet counters under `pins`, by reason name (every reason present).
pub fn reason_counts(pins: &std::path::Path) -> std::collections::BTreeMap<&'static str, u64> {
    lb_userspace::list::counters(&crate::pins(pins))
        .expect("read the counters map")
        .iter()
        .map(|c| (c.reason, c.packets))
        .collect()
}

/// Packets counted for every service port together (the per-service counters summed).
pub fn service_packets(pins: &std::path::Path) -> u64 {
    let map = crate::pins(pins)
        .map(lb_common::MAP_SVC_STATS)
        .expect("open the service counters");
    let mut packets = 0;
    lb_userspace::datapath::rows::sums(&map, lb_common::MAP_SVC_STATS, |_, c| packets += c.packets)
        .expect("read the service counters");
    packets
}

impl Drop for LoadedDatapath {
    fn drop(&mut self) {
        let _ = lb_userspace::cleanup::cleanup(&self.pins);
    }
}

/// A map's entries as raw bytes, key to value.
pub type RawEntries = std::collections::BTreeMap<Vec<u8>, Vec<u8>>;

/// The maps the datapath itself may change: per-flow state (conntrack, affinity, socket
/// translations). Everything else is the agent's to write.
pub const FLOW_STATE_MAPS: [&str; 6] = [
    lb_common::MAP_CT,
    lb_common::MAP_CT_ASSURED,
    lb_common::MAP_CT6,
    lb_common::MAP_CT6_ASSURED,
    lb_common::MAP_AFFINITY,
    lb_common::MAP_SOCK,
];

/// Every map under `pins` but the per-flow state, dumped byte by byte through the bpf(2)
/// syscall (not through the project's own readers). The counter maps (per-CPU, and the
/// [`COUNTER_MAPS`]), whose values the datapath adds to, are dumped by key only.
pub fn dump_agent_maps(
    pins: &std::path::Path,
) -> Result<std::collections::BTreeMap<&'static str, RawEntries>, String> {
    lb_common::ALL_MAPS
        .iter()
        .filter(|name| !FLOW_STATE_MAPS.contains(name))
        .map(|name| Ok((*name, dump_pinned(pins, name)?)))
        .collect()
}

/// The counter arrays the datapath adds to (a row per CPU): their values are counts.
pub const COUNTER_MAPS: [&str; 2] = [lb_common::MAP_SVC_STATS, lb_common::MAP_BACKEND_STATS];

/// The entries of the map pinned as `name` under `pins` (values empty for per-CPU maps and
/// the [`COUNTER_MAPS`]: counts the datapath adds to).
pub fn dump_pinned(pins: &std::path::Path, name: &str) -> Result<RawEntries, String> {
    use aya::maps::{MapData, MapType};
    use std::os::fd::{AsFd, AsRawFd};
    let fail = |e: &dyn std::fmt::Display| format!("{name}: {e}");
    let data = MapData::from_pin(pins.join(name)).map_err(|e| fail(&e))?;
    let info = data.info().map_err(|e| fail(&e))?;
    let per_cpu = COUNTER_MAPS.contains(&name)
        || matches!(
            info.map_type(),
            Ok(MapType::PerCpuHash | MapType::PerCpuArray | MapType::LruPerCpuHash)
        );
    let fd = data.fd().as_fd().as_raw_fd();
    let mut out = RawEntries::new();
    let mut key: Option<Vec<u8>> = None;
    loop {
        let mut next = vec![0u8; info.key_size() as usize];
        if !bpf_elem(BPF_MAP_GET_NEXT_KEY, fd, key.as_deref(), &mut next).map_err(|e| fail(&e))? {
            return Ok(out);
        }
        let mut value = vec![
            0u8;
            if per_cpu {
                0
            } else {
                info.value_size() as usize
            }
        ];
        if !per_cpu
            && !bpf_elem(BPF_MAP_LOOKUP_ELEM, fd, Some(&next), &mut value).map_err(|e| fail(&e))?
        {
            return Err(fail(&"an entry vanished while the map was dumped"));
        }
        out.insert(next.clone(), value);
        key = Some(next);
    }
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;

/// `union bpf_attr` for the map element commands.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value_or_next_key: u64,
    flags: u64,
}

/// A map element command on `fd` with `key` (none: the first key), filling `out`; false on
/// ENOENT (no such or no next entry).
fn bpf_elem(
    cmd: libc::c_long,
    fd: i32,
    key: Option<&[u8]>,
    out: &mut [u8],
) -> std::io::Result<bool> {
    let mut attr = ElemAttr {
        map_fd: fd as u32,
        _pad: 0,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value_or_next_key: out.as_mut_ptr() as u64,
        flags: 0,
    };
    // SAFETY: the attribute points at buffers of the map's key and value sizes that live
    // through the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &raw mut attr,
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOENT) {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::chain;
    use lb_userspace::datapath::DatapathError;

    /// A map the kernel refuses to create: the errno is only the error's source, which the
    /// message of a failed load must carry.
    #[test]
    fn a_load_error_says_the_kernel_errno() {
        let refused =
            DatapathError::Load(aya::EbpfError::MapError(aya::maps::MapError::CreateError {
                name: lb_common::MAP_CT.into(),
                io_error: std::io::Error::from_raw_os_error(12),
            }));
        let errno = std::io::Error::from_raw_os_error(12).to_string();
        assert!(!refused.to_string().contains(&errno), "{refused}");
        let text = chain(&refused);
        assert!(
            text.contains(&format!("failed to create map `{}`", lb_common::MAP_CT))
                && text.ends_with(&errno),
            "{text}"
        );
        assert_eq!(
            text.matches("failed to create map").count(),
            1,
            "each cause said once: {text}"
        );
    }
}
