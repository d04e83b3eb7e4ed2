//! `xlb emit` and `xlb desired`: what kube-proxy's modes and xlb's maps would hold for a
//! source, without touching the kernel.

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use lb_userspace::{
    desired, emit,
    emit::MasqueradeMark,
    model::{Cidr, IpFamily, LocalDetector, NodeSettings},
    source::file,
};

use super::source_file;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Family {
    Ipv4,
    Ipv6,
    /// Both proxiers, as kube-proxy runs them on a dual-stack node: the IPv4 output, then
    /// the IPv6 one (`ip6tables-restore`'s payload, the `ip6 kube-proxy` table).
    Dual,
}

/// Print the rules kube-proxy would write in MODE for a source (nothing is applied).
///
/// Node settings come from the flags; when the source file has a `kind: TestConfig`
/// document (the kube-proxy conformance format), its settings are the defaults and
/// flags given explicitly override them.
#[derive(clap::Args)]
pub struct EmitArgs {
    mode: emit::Mode,
    /// `file:PATH`.
    #[arg(long)]
    source: String,
    #[command(flatten)]
    node: NodeFlags,
    #[command(flatten)]
    writer: WriterFlags,
}

/// Print the maps a source would produce, without touching the kernel.
#[derive(clap::Args)]
pub struct DesiredArgs {
    /// `file:PATH`.
    #[arg(long)]
    source: String,
}

/// kube-proxy's node flags (all optional: unset keeps the default or the TestConfig value).
#[derive(clap::Args)]
pub struct NodeFlags {
    /// This node's name (`--hostname-override`): endpoints with this nodeName are local.
    #[arg(long)]
    node_name: Option<String>,
    /// The node's zone label, for topology hints.
    #[arg(long)]
    zone: Option<String>,
    /// The proxier's IP family (default: the TestConfig's, else ipv4); `dual`: both. `xlb
    /// trace`: the traced packet's family, which picks a dual-stack Service's ClusterIP
    /// (default: the Service's primary family, the first of its ipFamilies).
    #[arg(long, value_enum, alias = "family")]
    ip_family: Option<Family>,
    /// Node IPs (comma-separated); the first of the family is used for DNAT/allow-from-node.
    #[arg(long, value_delimiter = ',')]
    node_ip: Vec<String>,
    /// Every local address of the node (comma-separated), for nodePortAddresses and LOCAL.
    #[arg(long, value_delimiter = ',')]
    local_address: Vec<String>,
    /// `--cluster-cidr`: pod traffic detection (detect-local-mode ClusterCIDR).
    #[arg(long)]
    cluster_cidr: Option<String>,
    /// No local-traffic detector at all (overrides --cluster-cidr and the TestConfig).
    #[arg(long)]
    no_local_detector: bool,
    /// `--masquerade-all`.
    #[arg(long)]
    masquerade_all: Option<bool>,
    /// `--nodeport-addresses` CIDRs (comma-separated; empty = all local addresses).
    #[arg(long, value_delimiter = ',')]
    nodeport_addresses: Vec<String>,
    /// `--iptables-localhost-nodeports`.
    #[arg(long)]
    localhost_nodeports: Option<bool>,
    /// Service CIDRs (nftables drops traffic to unallocated ClusterIPs in them).
    #[arg(long, value_delimiter = ',')]
    service_cidr: Vec<String>,
}

/// kube-proxy's writer flags (unset keeps the default or the TestConfig value).
#[derive(clap::Args)]
pub struct WriterFlags {
    /// `--iptables-masquerade-bit` (mark printed as kube-proxy does, e.g. 0x00004000).
    #[arg(long)]
    masquerade_bit: Option<u8>,
    /// `--ipvs-scheduler`.
    #[arg(long)]
    ipvs_scheduler: Option<String>,
}

impl WriterFlags {
    pub fn apply(&self, base: Option<emit::WriterOptions>) -> Result<emit::WriterOptions> {
        let mut o = base.unwrap_or_default();
        if let Some(bit) = self.masquerade_bit {
            if bit > 31 {
                bail!("--masquerade-bit must be 0..=31");
            }
            o.mark = MasqueradeMark::from_bit(bit);
        }
        if let Some(sch) = &self.ipvs_scheduler {
            o.ipvs.scheduler = sch.clone();
        }
        Ok(o)
    }
}

impl NodeFlags {
    /// `--ip-family` as given.
    pub fn ip_family(&self) -> Option<Family> {
        self.ip_family
    }

    pub fn apply(&self, base: Option<NodeSettings>) -> Result<NodeSettings> {
        let mut s = base.unwrap_or_default();
        let ip = |raw: &String| {
            lb_userspace::model::parse_ip(raw).with_context(|| format!("{raw:?} is not an IP"))
        };
        let cidr = |raw: &String| {
            Cidr::parse_sloppy(raw).with_context(|| format!("{raw:?} is not a CIDR"))
        };
        if let Some(n) = &self.node_name {
            s.node_name = n.clone();
        }
        if let Some(z) = &self.zone {
            s.zone = Some(z.clone());
        }
        match self.ip_family {
            Some(Family::Ipv4) => s.family = IpFamily::V4,
            Some(Family::Ipv6) => s.family = IpFamily::V6,
            Some(Family::Dual) | None => {}
        }
        if !self.node_ip.is_empty() {
            s.node_ips = self.node_ip.iter().map(ip).collect::<Result<_>>()?;
        }
        if !self.local_address.is_empty() {
            s.local_addresses = self.local_address.iter().map(ip).collect::<Result<_>>()?;
        }
        if let Some(c) = &self.cluster_cidr {
            s.detector = LocalDetector::ClusterCidr(cidr(c)?);
        }
        if self.no_local_detector {
            s.detector = LocalDetector::None;
        }
        if let Some(m) = self.masquerade_all {
            s.masquerade_all = m;
        }
        if !self.nodeport_addresses.is_empty() {
            s.node_port_addresses = self
                .nodeport_addresses
                .iter()
                .map(cidr)
                .collect::<Result<_>>()?;
        }
        if let Some(l) = self.localhost_nodeports {
            s.localhost_node_ports = l;
        }
        if !self.service_cidr.is_empty() {
            s.service_cidrs = self.service_cidr.iter().map(cidr).collect::<Result<_>>()?;
        }
        Ok(s)
    }
}

pub fn run(args: EmitArgs) -> Result<()> {
    let loaded = file::load(&source_file(&args.source)?)?;
    for e in &loaded.errors {
        eprintln!("warning: {e}");
    }
    let (settings, options) = match loaded.test_config {
        Some(t) => (Some(t.settings), Some(t.options)),
        None => (None, None),
    };
    let settings = args.node.apply(settings)?;
    let options = args.writer.apply(options)?;
    if args.node.ip_family != Some(Family::Dual) {
        print!(
            "{}",
            emit::render(args.mode, &loaded.model, &settings, &options)
        );
        return Ok(());
    }
    if args.mode == emit::Mode::Userspace {
        bail!("kube-proxy's userspace mode has one proxier, IPv4: --ip-family dual does not apply");
    }
    for family in [IpFamily::V4, IpFamily::V6] {
        let settings = NodeSettings {
            family,
            ..settings.clone()
        };
        println!("{}", dual_header(args.mode, family));
        print!(
            "{}",
            emit::render(args.mode, &loaded.model, &settings, &options)
        );
    }
    Ok(())
}

/// The comment before each proxier's output with `--ip-family dual`: what loads it.
fn dual_header(mode: emit::Mode, family: IpFamily) -> String {
    let v6 = family == IpFamily::V6;
    let tool = match mode {
        emit::Mode::Iptables | emit::Mode::Userspace if v6 => "ip6tables-restore",
        emit::Mode::Iptables | emit::Mode::Userspace => "iptables-restore",
        emit::Mode::Nftables => "nft -f",
        emit::Mode::Ipvs if v6 => {
            "ipvsadm -R (IPv6 virtual servers), ipset restore, ip6tables-restore"
        }
        emit::Mode::Ipvs => "ipvsadm -R, ipset restore, iptables-restore",
    };
    let which = if v6 { "IPv6" } else { "IPv4" };
    format!("# kube-proxy's {which} proxier ({tool})")
}

pub fn run_desired(args: DesiredArgs) -> Result<()> {
    let loaded = file::load(&source_file(&args.source)?)?;
    for e in &loaded.errors {
        eprintln!("warning: {e}");
    }
    let (d, problems) = desired::compute(
        &loaded.model,
        &mut lb_userspace::reconcile::Ids::default(),
        desired::Limits::default(),
    );
    for p in &problems {
        eprintln!("warning: {p}");
    }
    print!("{}", d.dump());
    Ok(())
}
