//! The process's own series, as every Prometheus client library names them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), from `/proc/self`.

use std::fmt;

use nix::unistd::SysconfVar;

use prometheus_client::{
    collector::Collector,
    encoding::DescriptorEncoder,
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

use super::collect::single;

/// Reads `/proc/self` at each scrape (a few small files).
#[derive(Debug)]
pub(super) struct Process {
    /// Unix seconds the process started at (fixed).
    start: Option<f64>,
}

/// `/proc/self/stat`'s fields after the command name (the first is the state).
fn stat_fields() -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

fn sysconf(var: SysconfVar) -> f64 {
    match nix::unistd::sysconf(var) {
        Ok(Some(v)) if v > 0 => v as f64,
        _ => 0.0,
    }
}

/// Field `n` of stat(5) (1-based, as the manual numbers them; `n` ≥ 4).
fn field(f: &[u64], n: usize) -> u64 {
    f.get(n - 4).copied().unwrap_or(0)
}

impl Process {
    pub(super) fn new() -> Self {
        let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        let ticks = sysconf(SysconfVar::CLK_TCK);
        let start = match (btime, stat_fields()) {
            (Some(b), Some(f)) if ticks > 0.0 => Some(b + field(&f, 22) as f64 / ticks),
            _ => None,
        };
        Self { start }
    }
}

impl Collector for Process {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let Some(f) = stat_fields() else {
            return Ok(());
        };
        let ticks = sysconf(SysconfVar::CLK_TCK).max(1.0);
        let cpu = (field(&f, 14) + field(&f, 15)) as f64 / ticks;
        single(
            &mut enc,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            ConstCounter::new(cpu),
        )?;
        let rss = field(&f, 24) as f64 * sysconf(SysconfVar::PAGE_SIZE);
        single(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            ConstGauge::new(rss),
        )?;
        single(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            ConstGauge::new(field(&f, 23) as f64),
        )?;
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            single(
                &mut enc,
                "process_open_fds",
                "Number of open file descriptors",
                ConstGauge::new(dir.count() as i64),
            )?;
        }
        use nix::sys::resource::{Resource, getrlimit};
        if let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) {
            single(
                &mut enc,
                "process_max_fds",
                "Maximum number of open file descriptors",
                ConstGauge::new(soft as f64),
            )?;
        }
        match self.start {
            Some(start) => single(
                &mut enc,
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                ConstGauge::new(start),
            ),
            None => Ok(()),
        }
    }
}
