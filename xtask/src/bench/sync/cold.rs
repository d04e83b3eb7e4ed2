//! The cold full sync: N services × M endpoints from empty maps to programmed.

use std::time::Instant;

use anyhow::{Result, bail};

use super::{COLD_TRIALS, Cold};
use crate::bench::{
    Summary,
    fixture::{Capacities, Datapath, model, reset_peak_rss, status_kb},
};

pub(super) fn cold(services: usize, endpoints: usize) -> Result<Cold> {
    let t = Instant::now();
    let m = model(services, |_| endpoints)?;
    let parse_s = t.elapsed().as_secs_f64();
    let (mut compute, mut apply, mut total, mut peak) = (vec![], vec![], vec![], vec![]);
    let mut hwm_mib = 0.0;
    let mut writes = 0;
    for _ in 0..COLD_TRIALS {
        let mut dp = Datapath::load(Capacities::for_services(services, services * endpoints))?;
        reset_peak_rss()?;
        let rss0 = status_kb("self", "VmRSS")?;
        let t = dp.program_incremental(&m, true, [])?;
        let hwm = status_kb("self", "VmHWM")?;
        compute.push(t.compute.as_secs_f64());
        apply.push(t.apply.as_secs_f64());
        total.push((t.compute + t.apply).as_secs_f64());
        peak.push(hwm.saturating_sub(rss0) as f64 / 1024.0);
        hwm_mib = hwm as f64 / 1024.0;
        writes = t.writes + t.deletes;
        let programmed = dp.current().services.len();
        if programmed != services {
            bail!("cold sync programmed {programmed} of {services} services");
        }
    }
    let c = Cold {
        services,
        endpoints,
        parse_s,
        compute_s: Summary::of(&compute),
        apply_s: Summary::of(&apply),
        total_s: Summary::of(&total),
        peak_mib: Summary::of(&peak),
        hwm_mib,
        writes,
    };
    println!(
        "cold {services} × {endpoints}: {} s (compute {} s, apply {} s), peak +{} MiB",
        c.total_s.show(3),
        c.compute_s.show(3),
        c.apply_s.show(3),
        c.peak_mib.show(1)
    );
    Ok(c)
}
