//! `cargo xtask`: set up the machine, build, run the demo, run the tests.

mod bench;
mod build;
mod demo;
mod docs_trace;
mod image;
mod lint;
mod setup;
mod verifier;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install or verify what the project needs (idempotent).
    Setup,
    /// Build the eBPF object (nightly, bpfel-unknown-none).
    BuildEbpf,
    /// Build the eBPF object and the `xlb` binary with it embedded.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// The demo: namespaces, backends, the agent on examples/demo-services.yaml, traffic.
    Run {
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        duration: Option<u64>,
        /// The services file.
        #[arg(long, default_value = "examples/demo-services.yaml")]
        services: std::path::PathBuf,
        /// Start on kube-proxy's iptables rules (long-lived connections open through
        /// them), then start xlb with `--takeover-from kube-proxy` after three rounds.
        #[arg(long)]
        takeover: bool,
    },
    /// Benchmarks (release build): `datapath`, `sync`, `memory`, `metrics`, `traffic`,
    /// `northsouth`, `shadow` (no root needed), or `all`; each writes its table to docs/benchmarks.md (and most a plot
    /// to docs/).
    Bench {
        /// Which bench.
        name: String,
    },
    /// Writes docs/how-a-packet-reaches-a-pod.md from real `xlb trace` output (its own lab
    /// of namespaces, agent and cgroup, removed when done).
    DocsTrace,
    /// The container image deploy/ names, as an OCI archive (with Docker's manifest.json):
    /// release xlb, the node tools it runs and their libraries, from this host; no
    /// container daemon or registry. Load it with `docker load`, `podman load` or
    /// `ctr images import`.
    Image {
        /// The image's name and tag.
        #[arg(long, default_value = image::DEFAULT_TAG)]
        tag: String,
        /// The archive to write [default: xlb-image-TAG.tar in cargo's target directory].
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Each eBPF program's translated size and verifier processed-instruction count, as a
    /// markdown table (the object just built, or `--object`).
    Verifier {
        /// An eBPF object to read instead of building one.
        #[arg(long)]
        object: Option<std::path::PathBuf>,
    },
    /// rustfmt and clippy (`-D warnings`) for the workspace and for lb-ebpf.
    Lint,
    /// Every test tier: unit, golden, packet (TestRun) and real traffic; without a filter,
    /// the lint step too.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let root = build::workspace_root();
    std::env::set_current_dir(&root)?;
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::BuildEbpf => build::ebpf().map(|_| ()),
        Command::Build { release } => build::all(release).map(|_| ()),
        Command::Run {
            duration,
            services,
            takeover,
        } => {
            setup::run()?;
            let xlb = build::all(false)?;
            demo::run(&xlb, &services, duration, takeover)
        }
        // A pure bench: no setup, no eBPF or agent build (its release rerun builds xtask only).
        Command::Bench { name } if bench::PURE.contains(&name.as_str()) => {
            bench::run(std::path::Path::new("xlb"), &name)
        }
        Command::Bench { name } => {
            setup::run()?;
            let xlb = build::all(true)?;
            bench::run(&xlb, &name)
        }
        Command::DocsTrace => {
            setup::run()?;
            let xlb = build::all(false)?;
            docs_trace::run(&xlb)
        }
        Command::Image { tag, out } => {
            setup::run()?;
            let xlb = build::all(true)?;
            image::run(&xlb, &tag, out)
        }
        Command::Verifier { object } => {
            let object = match object {
                Some(o) => o,
                None => {
                    setup::run()?;
                    build::ebpf()?
                }
            };
            verifier::run(&object)
        }
        Command::Lint => {
            setup::run()?;
            build::ebpf()?;
            lint::run()
        }
        Command::Test { args } => {
            setup::run()?;
            build::test(&args)
        }
    }
}
