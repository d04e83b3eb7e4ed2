//! Where the agent's heap goes at `SERVICES` × `ENDPOINTS` (default 10,000 × 10): the
//! synthetic services of `cargo xtask bench memory` parsed as the file source parses them,
//! the source's digest, a full computation (`Incremental::full`, then the compaction the
//! agent does after a full sync) with the agent's memory settings, then each part dropped
//! in turn; glibc's `mallinfo2` (in use, free among live blocks) after each step.
//!
//! `cargo run --release -p lb-userspace --example heap_profile -- [SERVICES [ENDPOINTS]]`

use std::net::Ipv4Addr;

use lb_userspace::{
    desired::{Limits, NodeContext},
    reconcile::{Ids, Incremental},
    source::{events::Digest, file},
};

/// (in use, free among live blocks) in KiB.
fn heap() -> (usize, usize) {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    ((m.uordblks + m.hblkhd) / 1024, m.fordblks / 1024)
}

struct Steps {
    last: usize,
}

impl Steps {
    fn step(&mut self, what: &str) {
        let (used, free) = heap();
        println!(
            "{what:<44} in use {:>8.1} MiB ({:>+7.1})  free {:>6.1} MiB",
            used as f64 / 1024.0,
            (used as f64 - self.last as f64) / 1024.0,
            free as f64 / 1024.0
        );
        self.last = used;
    }
}

/// The bench's services: service `i` on 10.96.0.0 + i, its backends 10.128.0.0 + 16 i + k.
fn services_yaml(services: usize, endpoints: usize) -> String {
    let mut y = String::new();
    for i in 0..services {
        let vip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + i as u32);
        y.push_str(&format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: test, name: s{i}}}\nspec:\n  clusterIP: {vip}\n  ports:\n  - {{name: p, port: 80, protocol: TCP, targetPort: 8080}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: test\n  name: s{i}-1\n  labels: {{kubernetes.io/service-name: s{i}}}\naddressType: IPv4\nports:\n- {{name: p, port: 8080, protocol: TCP}}\nendpoints:\n"
        ));
        for k in 0..endpoints {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * 16 + k) as u32);
            y.push_str(&format!(
                "- addresses: [\"{ip}\"]\n  conditions: {{ready: true}}\n"
            ));
        }
    }
    y
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let services: usize = args.next().map_or(Ok(10_000), |a| a.parse())?;
    let endpoints: usize = args.next().map_or(Ok(10), |a| a.parse())?;
    // The agent's settings (agent/memory.rs).
    // SAFETY: mallopt only changes an allocator setting.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
    let mut s = Steps { last: heap().0 };
    s.step("start");
    let text = services_yaml(services, endpoints);
    let loaded = file::parse("services.yaml", &text)?;
    drop(text);
    s.step("model parsed (text dropped)");
    let mut model = loaded.model;
    model.compact();
    s.step("model compacted (as the agent takes it)");
    let digest = Digest::of(&model);
    s.step("file source's digest");
    let node = NodeContext::new("node1", &[], false);
    let limits = Limits {
        svc_entries: (services * (endpoints + 1) + 64).next_power_of_two() as u32,
        backends: (services * endpoints + 64).next_power_of_two() as u32,
        ..Limits::default()
    };
    let mut ids = Ids::default();
    let mut engine = Incremental::default();
    engine.full(&model, &node, &mut ids, limits);
    s.step("Incremental::full");
    engine.compact();
    ids.compact(engine.desired());
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    s.step("compacted, trimmed (steady state)");
    // The indices first: they find their backends in the desired state (one copy).
    drop(ids);
    s.step("indices (Ids) dropped");
    let mut desired = engine.take_desired(&mut Ids::default());
    drop(std::mem::take(&mut desired.services));
    s.step("desired frontends (services) dropped");
    drop(std::mem::take(&mut desired.backends));
    s.step("desired backends dropped");
    drop(std::mem::take(&mut desired.names));
    s.step("desired names dropped");
    drop(std::mem::take(&mut desired.filter));
    s.step("desired filter bits dropped");
    drop(desired);
    s.step("desired state dropped");
    drop(engine);
    s.step("bookkeeping (Incremental) dropped");
    drop(digest);
    s.step("digest dropped");
    // A cold full computation's time (fresh indices, as at the agent's start), best of 5.
    let best = (0..5)
        .map(|_| {
            let (mut ids, mut engine) = (Ids::default(), Incremental::default());
            let t = std::time::Instant::now();
            engine.full(&model, &node, &mut ids, limits);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    drop(model);
    s.step("model dropped");
    println!("cold Incremental::full: {best:.3} s (best of 5)");
    Ok(())
}
