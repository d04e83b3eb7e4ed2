//! The sysctls the agent reads or sets: the node's ephemeral ports, and the kernel
//! conntrack's size and timeouts, set at start as kube-proxy sets them.
//!
//! xlb rewrites where netfilter's NAT would, so the kernel's conntrack still tracks every
//! flow that crosses tc; on a node that never ran kube-proxy its table and timeouts would
//! stay at the kernel's defaults (a CLOSE_WAIT entry gone after 60 s, a table smaller than
//! xlb's). [`apply`] writes what [`KernelConntrack`] asks, with one rule kube-proxy lacks:
//! it never lowers a value another component raised (a size above what is asked, or a
//! timeout above what is asked that is not the kernel's own default, is left and said).
//! The table's size and hash size are the host's: the kernel lets only the initial network
//! namespace write them (elsewhere it shows `nf_conntrack_max` read-only), so an agent in
//! another namespace computes and reports them but leaves them alone. A write the kernel
//! or the mount refuses (a read-only `/proc/sys` in a container) is reported by name and
//! the agent goes on.

use std::path::Path;

/// `net.ipv4.ip_local_port_range`: the node's ephemeral ports.
pub fn ephemeral_ports() -> Option<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text
        .split_whitespace()
        .filter_map(|p| p.parse::<u16>().ok());
    Some(it.next()?..=it.next()?)
}

/// Why this network namespace has no IPv6, if it has none: the kernel was booted without
/// it (`ipv6.disable=1`: no `/proc/sys/net/ipv6`), or `net.ipv6.conf.all.disable_ipv6` is 1.
pub fn ipv6_off() -> Option<&'static str> {
    if !Path::new("/proc/sys/net/ipv6").exists() {
        return Some("the kernel runs without IPv6");
    }
    match read("/proc/sys/net/ipv6/conf/all/disable_ipv6") {
        Ok(1) => Some("net.ipv6.conf.all.disable_ipv6 = 1"),
        _ => None,
    }
}

/// What the agent asks of the kernel's conntrack at start, as kube-proxy's `conntrack`
/// settings do; 0 (and `false`) leaves a setting as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelConntrack {
    /// `net.netfilter.nf_conntrack_max` (the hash size follows: a quarter of it).
    pub max: u64,
    /// `nf_conntrack_tcp_timeout_established`, seconds.
    pub tcp_established_s: u64,
    /// `nf_conntrack_tcp_timeout_close_wait`, seconds.
    pub tcp_close_wait_s: u64,
    /// `nf_conntrack_tcp_be_liberal` set to 1.
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout`, seconds.
    pub udp_s: u64,
    /// `nf_conntrack_udp_timeout_stream`, seconds.
    pub udp_stream_s: u64,
}

/// One kernel setting the agent may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knob {
    /// As `sysctl` names it (the hash size: its module parameter's path).
    pub name: &'static str,
    /// Its file.
    pub path: &'static str,
    /// Only the initial network namespace may write it.
    pub global: bool,
    /// The kernel's own default, where it is a constant: a value that is neither this nor
    /// what xlb asks was set by someone (none: the kernel computes it, e.g. from memory).
    pub kernel_default: Option<u64>,
}

const NF: &str = "/proc/sys/net/netfilter/";

macro_rules! knob {
    ($name:literal, $global:expr, $default:expr) => {
        Knob {
            name: concat!("net.netfilter.", $name),
            path: concat!("/proc/sys/net/netfilter/", $name),
            global: $global,
            kernel_default: $default,
        }
    };
}

pub const CT_MAX: Knob = knob!("nf_conntrack_max", true, None);
pub const CT_HASHSIZE: Knob = Knob {
    name: "nf_conntrack.hashsize",
    path: "/sys/module/nf_conntrack/parameters/hashsize",
    global: true,
    kernel_default: None,
};
pub const CT_TCP_ESTABLISHED: Knob =
    knob!("nf_conntrack_tcp_timeout_established", false, Some(432_000));
pub const CT_TCP_CLOSE_WAIT: Knob = knob!("nf_conntrack_tcp_timeout_close_wait", false, Some(60));
pub const CT_TCP_BE_LIBERAL: Knob = knob!("nf_conntrack_tcp_be_liberal", false, Some(0));
pub const CT_UDP: Knob = knob!("nf_conntrack_udp_timeout", false, Some(30));
pub const CT_UDP_STREAM: Knob = knob!("nf_conntrack_udp_timeout_stream", false, Some(120));

impl KernelConntrack {
    /// Each setting with the value asked (0: leave it), the hash size a quarter of the
    /// table's size, as kube-proxy sizes it.
    pub fn wanted(&self) -> [(Knob, u64); 7] {
        [
            (CT_MAX, self.max),
            (CT_HASHSIZE, self.max / 4),
            (CT_TCP_ESTABLISHED, self.tcp_established_s),
            (CT_TCP_CLOSE_WAIT, self.tcp_close_wait_s),
            (CT_TCP_BE_LIBERAL, u64::from(self.tcp_be_liberal)),
            (CT_UDP, self.udp_s),
            (CT_UDP_STREAM, self.udp_stream_s),
        ]
    }
}

/// What became of one setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Written: it was `from`.
    Set { from: u64 },
    /// Already the value asked.
    Kept,
    /// Asked 0: left as it is, as kube-proxy.
    Left,
    /// Higher than asked (a size, or a timeout someone set): not lowered.
    Higher,
    /// The host's setting and this is not the initial network namespace.
    NotOwned,
    /// nf_conntrack is not loaded (no file): the kernel tracks nothing to size.
    Missing,
    /// The write failed (the reason, e.g. a read-only `/proc/sys`).
    Failed(String),
}

impl Outcome {
    /// The metrics' label.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Set { .. } => "set",
            Outcome::Kept => "kept",
            Outcome::Left => "left",
            Outcome::Higher => "higher",
            Outcome::NotOwned => "not-owned",
            Outcome::Missing => "missing",
            Outcome::Failed(_) => "failed",
        }
    }
}

/// One setting after [`apply`]: asked, in force (none: unreadable), and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub knob: Knob,
    pub wanted: u64,
    pub value: Option<u64>,
    pub outcome: Outcome,
}

/// Whether to write `wanted` over `current` (pure): `None` to write, else why not.
pub fn decide(knob: &Knob, wanted: u64, current: u64, owned: bool) -> Option<Outcome> {
    if wanted == 0 {
        return Some(Outcome::Left);
    }
    if current == wanted {
        return Some(Outcome::Kept);
    }
    if knob.global && !owned {
        return Some(Outcome::NotOwned);
    }
    // Never lower what someone raised: a size is only ever raised; a timeout that is not
    // the kernel's default was set by someone.
    if current > wanted && knob.kernel_default != Some(current) {
        return Some(Outcome::Higher);
    }
    None
}

/// Whether this network namespace may write the host's conntrack size: the kernel shows
/// `nf_conntrack_max` read-only in every other namespace.
pub fn owns_host_conntrack() -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(CT_MAX.path).is_ok_and(|m| m.permissions().mode() & 0o200 != 0)
}

fn read(path: &str) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e}")))
}

/// Writes what `ct` asks of the kernel's conntrack (see the module's page), logs each
/// setting it changed or could not, and returns every setting's outcome.
pub fn apply(ct: &KernelConntrack) -> Vec<Applied> {
    let owned = owns_host_conntrack();
    let loaded = Path::new(NF).join("nf_conntrack_max").exists();
    if !loaded {
        tracing::warn!(
            "the kernel's conntrack (nf_conntrack) is not loaded: its size and timeouts are not set"
        );
    }
    ct.wanted()
        .into_iter()
        .map(|(knob, wanted)| apply_one(knob, wanted, owned, loaded))
        .collect()
}

fn apply_one(knob: Knob, wanted: u64, owned: bool, loaded: bool) -> Applied {
    let done = |value, outcome| Applied {
        knob,
        wanted,
        value,
        outcome,
    };
    let current = match read(knob.path) {
        Ok(v) => v,
        Err(_) if !loaded => return done(None, Outcome::Missing),
        Err(e) => {
            tracing::warn!(sysctl = knob.name, "cannot read {}: {e}", knob.path);
            return done(None, Outcome::Failed(format!("cannot read: {e}")));
        }
    };
    if let Some(outcome) = decide(&knob, wanted, current, owned) {
        match &outcome {
            Outcome::Higher => tracing::info!(
                sysctl = knob.name,
                value = current,
                asked = wanted,
                "higher than asked: not lowered"
            ),
            Outcome::NotOwned => tracing::info!(
                sysctl = knob.name,
                value = current,
                computed = wanted,
                "not the initial network namespace: the host's setting is left alone"
            ),
            _ => {}
        }
        return done(Some(current), outcome);
    }
    match std::fs::write(knob.path, wanted.to_string()) {
        Ok(()) => {
            tracing::info!(sysctl = knob.name, value = wanted, was = current, "set");
            done(Some(wanted), Outcome::Set { from: current })
        }
        Err(e) => {
            let why = match e.raw_os_error() {
                Some(libc::EROFS) => format!(
                    "{e} (a read-only /proc/sys or /sys: run privileged, or set it on the host)"
                ),
                Some(libc::EACCES | libc::EPERM) => {
                    format!("{e} (needs CAP_NET_ADMIN in the initial user namespace)")
                }
                _ => e.to_string(),
            };
            tracing::warn!(
                sysctl = knob.name,
                value = current,
                asked = wanted,
                "cannot write {}: {why}; left as it is",
                knob.path
            );
            done(Some(current), Outcome::Failed(why))
        }
    }
}

/// The timeouts xlb's collector of assured flows uses, in seconds: what was asked, else
/// what is in force in the kernel, else kube-proxy's (and the kernel's) defaults, so xlb's
/// entry of a flow ends when the kernel's does.
pub fn collector_timeouts(applied: &[Applied]) -> crate::datapath::ct_gc::Timeouts {
    let secs = |knob: Knob, default: u64| {
        applied
            .iter()
            .find(|a| a.knob == knob)
            .and_then(|a| match a.outcome {
                Outcome::Failed(_) | Outcome::NotOwned if a.wanted > 0 => Some(a.wanted),
                _ => a.value.filter(|v| *v > 0),
            })
            .unwrap_or(default)
    };
    crate::datapath::ct_gc::Timeouts {
        tcp_established_s: secs(CT_TCP_ESTABLISHED, 24 * 3600),
        tcp_close_wait_s: secs(CT_TCP_CLOSE_WAIT, 3600),
        udp_stream_s: secs(CT_UDP_STREAM, 120),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_leaves_and_equal_keeps() {
        assert_eq!(decide(&CT_UDP, 0, 30, true), Some(Outcome::Left));
        assert_eq!(decide(&CT_UDP, 30, 30, true), Some(Outcome::Kept));
        assert_eq!(decide(&CT_UDP, 45, 30, true), None);
    }

    #[test]
    fn nothing_another_component_raised_is_lowered() {
        // The kernel's default established timeout (5 days) is lowered to kube-proxy's.
        assert_eq!(decide(&CT_TCP_ESTABLISHED, 86_400, 432_000, true), None);
        // A value someone set above both is left.
        assert_eq!(
            decide(&CT_TCP_ESTABLISHED, 86_400, 864_000, true),
            Some(Outcome::Higher)
        );
        // Sizes are only raised.
        assert_eq!(
            decide(&CT_MAX, 131_072, 262_144, true),
            Some(Outcome::Higher)
        );
        assert_eq!(decide(&CT_MAX, 524_288, 262_144, true), None);
        assert_eq!(
            decide(&CT_HASHSIZE, 65_536, 262_144, true),
            Some(Outcome::Higher)
        );
    }

    #[test]
    fn the_hosts_settings_are_written_only_from_its_namespace() {
        assert_eq!(
            decide(&CT_MAX, 524_288, 262_144, false),
            Some(Outcome::NotOwned)
        );
        assert_eq!(
            decide(&CT_MAX, 131_072, 262_144, false),
            Some(Outcome::NotOwned)
        );
        assert_eq!(decide(&CT_TCP_CLOSE_WAIT, 3_600, 60, false), None);
    }

    #[test]
    fn the_hash_size_is_a_quarter_of_the_table() {
        let ct = KernelConntrack {
            max: 524_288,
            ..Default::default()
        };
        let w = ct.wanted();
        assert_eq!(w[1], (CT_HASHSIZE, 131_072));
        assert!(w[2..].iter().all(|(_, v)| *v == 0));
    }

    #[test]
    fn the_collector_follows_what_is_asked_then_what_is_in_force() {
        let a = |knob, wanted, value, outcome| Applied {
            knob,
            wanted,
            value: Some(value),
            outcome,
        };
        let applied = [
            a(
                CT_TCP_ESTABLISHED,
                7_200,
                7_200,
                Outcome::Set { from: 432_000 },
            ),
            a(
                CT_TCP_CLOSE_WAIT,
                3_600,
                60,
                Outcome::Failed("read-only".into()),
            ),
            a(CT_UDP_STREAM, 0, 150, Outcome::Left),
        ];
        let t = collector_timeouts(&applied);
        assert_eq!(
            (t.tcp_established_s, t.tcp_close_wait_s, t.udp_stream_s),
            (7_200, 3_600, 150)
        );
        let none = collector_timeouts(&[]);
        assert_eq!(
            (
                none.tcp_established_s,
                none.tcp_close_wait_s,
                none.udp_stream_s
            ),
            (86_400, 3_600, 120)
        );
    }
}
