//! `xlb trace`: one packet through the loaded datapath (and, with `--mode`, through the
//! rules a kube-proxy mode would write), step by step in Kubernetes terms.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::ValueEnum;
use lb_userspace::{
    DEFAULT_BPFFS_DIR, EBPF_OBJECT,
    model::Protocol,
    source::file,
    trace::{
        ebpf,
        request::{self, Origin, Source, Target},
    },
};

use super::{node_name, source_file};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
}

/// Trace one packet (or, from the node, one connect()) to a service: which frontend it
/// matches, the endpoints the policies leave, affinity, the backend, each rewrite, the
/// verdict and its counter. Changes no live state.
#[derive(clap::Args)]
pub struct TraceArgs {
    /// `pod/NAMESPACE/NAME`, `node`, or `IP[:PORT]`.
    #[arg(long)]
    from: String,
    /// `svc/NAMESPACE/NAME[:PORT]` (its ClusterIP) or `IP:PORT` (any frontend).
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
    /// This node's name (which endpoints are local) [default: $NODE_NAME, else the
    /// hostname].
    #[arg(long)]
    node_name: Option<String>,
}

fn load_source(spec: Option<&str>) -> Result<Source> {
    let Some(spec) = spec else {
        return Ok(Source::default());
    };
    let path = source_file(spec)?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let loaded = file::parse(&path.display().to_string(), &text)?;
    Ok(Source {
        model: Some(loaded.model),
        pods: request::pods(&text),
    })
}

pub fn run(args: TraceArgs) -> Result<()> {
    let from = Origin::parse(&args.from)?;
    let to = Target::parse(&args.to)?;
    let source = load_source(args.source.as_deref())?;
    let proto = args.proto.map(|p| match p {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
    });
    let req = request::resolve(&from, &to, proto, &source)?;
    let node = node_name(args.node_name);
    let ctx = ebpf::Context {
        pins: &args.pin_dir,
        source: &source,
        node_name: &node,
    };
    let report = ebpf::trace(EBPF_OBJECT, &ctx, &req).with_context(|| {
        format!(
            "tracing through the datapath pinned in {}",
            args.pin_dir.display()
        )
    })?;
    print!("{report}");
    Ok(())
}
