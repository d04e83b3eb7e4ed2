//! The programs' opt-in debug log (aya-log, `xlb agent --bpf-log debug`): a flag in the
//! node configuration map turns it on in the programs; a thread reads their ring buffer
//! into the agent's log (target `xlb::bpf`), reason codes and actions by name.

use std::{
    os::fd::AsFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use aya_log::EbpfLogger;
use lb_common::REASON_NAMES;

use super::DatapathError;

/// Forwards the programs' records to `tracing`.
struct ToTracing;

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        tracing::info!(target: "xlb::bpf", "{}", readable(&record.args().to_string()));
    }

    fn flush(&self) {}
}

/// A record with `reason=N` and `action=N` spelled out (`reason=new_flow`,
/// `action=ok`).
pub fn readable(msg: &str) -> String {
    let xdp = msg.starts_with("xdp ");
    msg.split(' ')
        .map(|w| {
            if let Some(n) = w
                .strip_prefix("reason=")
                .and_then(|n| n.parse::<usize>().ok())
            {
                return format!(
                    "reason={}",
                    REASON_NAMES.get(n).copied().unwrap_or("unknown")
                );
            }
            if let Some(n) = w
                .strip_prefix("action=")
                .and_then(|n| n.parse::<i64>().ok())
            {
                let name = match (xdp, n) {
                    (false, 0) => "ok",
                    (false, 2) => "shot",
                    (false, 7) => "redirect",
                    (true, 1) => "drop",
                    (true, 2) => "pass",
                    (true, 3) => "tx",
                    (true, 4) => "redirect",
                    _ => return w.to_string(),
                };
                return format!("action={name}");
            }
            w.to_string()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The reader thread; stopped and joined on drop.
pub struct BpfLogReader {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BpfLogReader {
    /// Takes the object's log ring buffer and reads it until dropped.
    pub fn start(ebpf: &mut aya::Ebpf) -> Result<Self, DatapathError> {
        let mut logger =
            EbpfLogger::init_with_logger(ebpf, ToTracing).map_err(|e| DatapathError::Log {
                reason: e.to_string(),
            })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("xlb-bpf-log".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    use nix::poll::{PollFd, PollFlags, poll};
                    // A bounded wait, so the stop flag is seen.
                    let mut pfd = [PollFd::new(logger.as_fd(), PollFlags::POLLIN)];
                    let _ = poll(&mut pfd, 200u16);
                    logger.flush();
                }
            })
            .map_err(|e| DatapathError::Log {
                reason: format!("cannot start its reader thread: {e}"),
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for BpfLogReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_their_reasons_and_actions() {
        assert_eq!(
            readable("tc reason=1 action=0 proto=6 10.0.0.1:5 -> 10.0.0.2:80"),
            "tc reason=new_flow action=ok proto=6 10.0.0.1:5 -> 10.0.0.2:80"
        );
        assert_eq!(
            readable("xdp reason=16 action=4"),
            "xdp reason=xdp_redirect action=redirect"
        );
        assert_eq!(
            readable("tc reason=99 action=5"),
            "tc reason=unknown action=5"
        );
    }
}
