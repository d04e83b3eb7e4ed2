//! `xlb trace`: one packet through the loaded datapath (and, with `--mode`, through the
//! rules a kube-proxy mode would write), step by step in Kubernetes terms.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use lb_userspace::{
    DEFAULT_BPFFS_DIR, EBPF_OBJECT,
    datapath::pins::Pins,
    emit::{Mode as EmitMode, WriterOptions},
    model::{IpFamily, NodeSettings, Protocol},
    source::file,
    trace::{
        Report, ebpf,
        request::{self, Origin, Resolved, Source, Target},
        rules, side_by_side,
    },
};

use super::{
    emit::{Family, NodeFlags, WriterFlags},
    node_name, source_file,
};

/// What `--mode` traces through.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceMode {
    /// xlb's loaded programs (needs the agent's pins).
    Datapath,
    Iptables,
    Nftables,
    Ipvs,
    Userspace,
    /// The four kube-proxy modes side by side, and the datapath when its pins exist.
    All,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Trace one packet (or, from the node, one connect()) to a service: which frontend it
/// matches, the endpoints the policies leave, affinity, the backend, each rewrite, the
/// verdict and its counter. Changes no live state. IPv4 or IPv6: the packet's family is the
/// target address's, or for `--to svc/...` the Service's primary family unless
/// `--ip-family` picks the other one of a dual-stack Service.
#[derive(clap::Args)]
pub struct TraceArgs {
    /// `pod/NAMESPACE/NAME` (its address of the packet's family), `node`, `IP`,
    /// `IPv4:PORT` or `[IPv6]:PORT`.
    #[arg(long)]
    from: String,
    /// `svc/NAMESPACE/NAME[:PORT]` (its ClusterIP of `--ip-family`, else of its primary
    /// family), `IPv4:PORT` or `[IPv6]:PORT` (any frontend).
    #[arg(long)]
    to: String,
    /// The protocol [default: the service port's, else tcp].
    #[arg(long, value_enum)]
    proto: Option<Proto>,
    /// The agent's pin directory.
    #[arg(long, alias = "bpffs", default_value = DEFAULT_BPFFS_DIR)]
    pin_dir: PathBuf,
    /// The agent's `file:PATH` source: Services, EndpointSlices (and `kind: Pod` documents
    /// for `--from pod/...`), for names and policies in the output.
    #[arg(long, env = "XLB_SOURCE")]
    source: Option<String>,
    /// The datapath (default), or the rules `xlb emit` writes for a kube-proxy mode, rule by
    /// rule; `all` puts them side by side.
    #[arg(long, value_enum, default_value_t = TraceMode::Datapath)]
    mode: TraceMode,
    /// Width of each column with `--mode all`.
    #[arg(long, default_value_t = 60)]
    column_width: usize,
    /// Node settings as `xlb emit` takes them (the rule modes; `--node-name` also decides
    /// which endpoints the datapath trace calls local) [default node name: $NODE_NAME, else
    /// the hostname].
    #[command(flatten)]
    node: NodeFlags,
    #[command(flatten)]
    writer: WriterFlags,
}

/// The source, and its TestConfig's node and writer settings when it has one.
type TraceInput = (Source, Option<(NodeSettings, WriterOptions)>);

fn load_source(spec: Option<&str>) -> Result<TraceInput> {
    let Some(spec) = spec else {
        return Ok((Source::default(), None));
    };
    let path = source_file(spec)?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let loaded = file::parse(&path.display().to_string(), &text)?;
    Ok((
        Source {
            model: Some(loaded.model),
            pods: request::pods(&text),
        },
        loaded.test_config.map(|t| (t.settings, t.options)),
    ))
}

fn datapath(args: &TraceArgs, source: &Source, node: &str, req: &Resolved) -> Result<Report> {
    let context = || {
        format!(
            "tracing through the datapath pinned in {}",
            args.pin_dir.display()
        )
    };
    let pins = Pins::open(&args.pin_dir).with_context(context)?;
    let ctx = ebpf::Context {
        pins: &pins,
        source,
        node_name: node,
    };
    ebpf::trace(EBPF_OBJECT, &ctx, req).with_context(context)
}

fn rule_mode(
    mode: EmitMode,
    source: &Source,
    (settings, opts): (&NodeSettings, &WriterOptions),
    req: &Resolved,
) -> Result<Report> {
    let model = source
        .model
        .as_ref()
        .context("the rule modes need the services: give --source file:PATH")?;
    // kube-proxy's proxier of the packet's family.
    let family = req.family();
    let settings = &NodeSettings {
        family,
        ..settings.clone()
    };
    let src = match req.src {
        Some(a) => a.ip(),
        None => settings
            .node_ip()
            .or_else(|| {
                let mut local = settings.local_addresses.iter();
                local.find(|a| family.matches(**a)).copied()
            })
            .with_context(|| {
                format!(
                    "--from node in a rule mode needs the node's {} address: give --node-ip",
                    family.name()
                )
            })?,
    };
    let input = rules::Input {
        model,
        node: settings,
        opts,
        src,
        dst: req.dst,
        protocol: req.protocol,
        from_node: req.src.is_none(),
        from: &req.from,
        to: &req.to,
    };
    Ok(rules::trace(mode, &input))
}

pub fn run(args: TraceArgs) -> Result<()> {
    let from = Origin::parse(&args.from)?;
    let to = Target::parse(&args.to)?;
    let (source, test_config) = load_source(args.source.as_deref())?;
    let (base_node, base_opts) = test_config.unzip();
    let mut settings = args.node.apply(base_node)?;
    let opts = args.writer.apply(base_opts)?;
    if settings.node_name.is_empty() {
        settings.node_name = node_name(None);
    }
    let proto = args.proto.map(|p| match p {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
    });
    let family = match args.node.ip_family() {
        None => None,
        Some(Family::Ipv4) => Some(IpFamily::V4),
        Some(Family::Ipv6) => Some(IpFamily::V6),
        Some(Family::Dual) => {
            bail!("--ip-family dual: a traced packet has one family (ipv4 or ipv6)")
        }
    };
    let req = request::resolve(&from, &to, proto, family, &source)?;
    let one = |m: EmitMode| rule_mode(m, &source, (&settings, &opts), &req);
    let report = match args.mode {
        TraceMode::Datapath => datapath(&args, &source, &settings.node_name, &req)?,
        TraceMode::Iptables => one(EmitMode::Iptables)?,
        TraceMode::Nftables => one(EmitMode::Nftables)?,
        TraceMode::Ipvs => one(EmitMode::Ipvs)?,
        TraceMode::Userspace => one(EmitMode::Userspace)?,
        TraceMode::All => {
            let mut reports = Vec::new();
            if args.pin_dir.exists() {
                reports.push(datapath(&args, &source, &settings.node_name, &req)?);
            }
            for m in rules::MODES {
                reports.push(one(m)?);
            }
            print!("{}", side_by_side(&reports, args.column_width));
            println!();
            for r in &reports {
                println!(
                    "{:<32} => {}",
                    r.title.split(':').next().unwrap_or(""),
                    r.outcome
                );
            }
            return Ok(());
        }
    };
    print!("{report}");
    Ok(())
}
