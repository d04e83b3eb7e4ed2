//! One endpoint change → visible in the pinned maps, through the agent's incremental path.

use std::net::{Ipv4Addr, SocketAddrV4};

use anyhow::{Result, bail};
use lb_userspace::{desired, reconcile::Ids, source::events};
use xlb_tests::services::service_yaml;

use super::Change;
use crate::bench::{
    fixture::{
        Capacities, Datapath, Probe, SVC_PORT, TARGET_PORT, addr_add, backend_ip, model,
        parse_model, vip,
    },
    percentile,
};

pub(super) fn change(services: usize, endpoints: usize, changes: usize) -> Result<Change> {
    let mut m = model(services, |_| endpoints)?;
    let mut dp = Datapath::load(Capacities::for_services(
        services,
        services * (endpoints + 1),
    ))?;
    dp.program_incremental(&m, true, [])?;
    let probe = Probe::open(&dp.pins)?;
    let mut current: Vec<Vec<Ipv4Addr>> = (0..services)
        .map(|i| (0..endpoints).map(|k| backend_ip(i, k)).collect())
        .collect();
    let mut c = Change {
        services,
        endpoints,
        total_ms: vec![],
        compute_ms: vec![],
        apply_ms: vec![],
    };
    for n in 0..changes {
        let i = (n * 7_919 + 13) % services;
        let removed = current[i].remove(0);
        let added = addr_add(Ipv4Addr::new(10, 160, 0, 0), n as u32);
        current[i].push(added);
        let part = parse_model(&service_yaml(
            &format!("s{i}"),
            vip(i),
            SVC_PORT,
            "TCP",
            TARGET_PORT,
            &current[i],
        ))?;
        let Some((service, slices)) = part.slices.into_iter().next() else {
            bail!("no slice for s{i}");
        };
        let Some(slice) = slices.into_iter().next() else {
            bail!("no slice for s{i}");
        };
        let name = slice.name.clone();
        // The source's event (a converted EndpointSlice, as the watcher sends it): from here
        // to visible in the maps.
        let event = events::Stamped::now(events::Event::Slice {
            service,
            name,
            slice: Some(Box::new(slice)),
        });
        let t0 = event.since;
        let changed = events::apply(&mut m, event.event);
        let t = dp.program_incremental(&m, false, changed)?;
        let now = probe.backends(vip(i), SVC_PORT)?;
        let total = t0.elapsed();
        if !now.contains(&SocketAddrV4::new(added, TARGET_PORT))
            || now.contains(&SocketAddrV4::new(removed, TARGET_PORT))
        {
            bail!("endpoint change {n} not visible in the maps: {now:?}");
        }
        c.total_ms.push(total.as_secs_f64() * 1e3);
        c.compute_ms.push(t.compute.as_secs_f64() * 1e3);
        c.apply_ms.push(t.apply.as_secs_f64() * 1e3);
    }
    // The incremental state is still what a full computation gives.
    let (want, _) = desired::compute(&m, &mut Ids::default(), dp.maps.limits());
    if want.services.len() != dp.current().services.len()
        || want.backends.len() != dp.current().backends.len()
    {
        bail!("after {changes} changes the incremental state differs from a full computation");
    }
    println!(
        "endpoint change at {services} × {endpoints}: p50 {:.3} ms, p99 {:.3} ms",
        percentile(&c.total_ms, 50.0),
        percentile(&c.total_ms, 99.0)
    );
    Ok(c)
}
