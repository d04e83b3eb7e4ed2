//! `verifier`: what the kernel makes of each program of the eBPF object: every program
//! loaded on its own (the object's maps created fresh, unpinned), its translated size and
//! the verifier's processed-instruction count (`bpf_prog_info`), one markdown row per
//! program. Loaded as this process is (root: the verifier's privileged walk, which counts
//! what the CAP_BPF-only agent's would, bar the speculative paths).

use std::path::Path;

use anyhow::{Context, Result};
use aya::{EbpfLoader, programs::Program};

/// Prints the table for the object at `object`.
pub fn run(object: &Path) -> Result<()> {
    let bytes = std::fs::read(object).with_context(|| format!("reading {}", object.display()))?;
    let mut ebpf = EbpfLoader::new()
        .load(&bytes)
        .context("loading the object's maps")?;
    let mut names: Vec<String> = ebpf.programs().map(|(n, _)| n.to_string()).collect();
    names.sort();
    println!("| program | translated bytes | verifier: processed insns |");
    println!("|---|---:|---:|");
    for name in names {
        let Some(prog) = ebpf.program_mut(&name) else {
            continue;
        };
        let loaded = match prog {
            Program::SchedClassifier(p) => p.load(),
            Program::Xdp(p) => p.load(),
            Program::CgroupSockAddr(p) => p.load(),
            _ => continue,
        };
        loaded.with_context(|| format!("loading {name}"))?;
        let info = prog.info().with_context(|| format!("{name}'s info"))?;
        let show = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
        println!(
            "| {name} | {} | {} |",
            show(info.size_translated()),
            show(info.verified_instruction_count())
        );
    }
    Ok(())
}
