//! The counts the datapath holds in conntrack entries and has not added to the counter rows
//! yet (`CtValue::pending`): an assured flow's packets of the last second or so (at most
//! 127 packets or 8 MiB), summed by service and by backend index, for readers that show
//! the counters as they are now (`xlb list services|backends`).
//!
//! Only the assured tables are read: a flow not yet assured is counted straight into the
//! rows. The metrics leave these out (a Prometheus counter never goes down, and an entry's
//! pending counts go with it when the collector deletes it: see `ct_gc`).

use std::collections::HashMap;

use lb_common::{Counter, CtKey, CtKey6, CtValue, CtValue6, MAP_CT_ASSURED, MAP_CT6_ASSURED};

use super::{DatapathError, counts, pins::Pins};

/// Pending counts by service index and by backend index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    services: HashMap<u32, Counter>,
    backends: HashMap<u32, Counter>,
}

impl Pending {
    /// The pending counts of every assured entry pinned in `pins` (both families), read in
    /// batches.
    pub fn read(pins: &Pins) -> Result<Self, DatapathError> {
        let mut p = Self::default();
        let v4 = pins.map(MAP_CT_ASSURED)?;
        for (_, v) in counts::entries::<CtKey, CtValue>(&v4, MAP_CT_ASSURED)? {
            p.add(v.svc_id, v.backend_id, v.pending);
        }
        let v6 = pins.map(MAP_CT6_ASSURED)?;
        for (_, v) in counts::entries::<CtKey6, CtValue6>(&v6, MAP_CT6_ASSURED)? {
            p.add(v.svc_id, v.backend_id, v.pending);
        }
        Ok(p)
    }

    fn add(&mut self, svc_id: u32, backend_id: u32, pending: u32) {
        if pending == 0 {
            return;
        }
        let (packets, bytes) = lb_common::ct_pending(pending);
        for c in [
            self.services.entry(svc_id).or_default(),
            self.backends.entry(backend_id).or_default(),
        ] {
            c.packets += u64::from(packets);
            c.bytes += u64::from(bytes);
        }
    }

    /// Service index `id`'s pending counts.
    pub fn service(&self, id: u32) -> Counter {
        self.services.get(&id).copied().unwrap_or_default()
    }

    /// Backend index `id`'s pending counts.
    pub fn backend(&self, id: u32) -> Counter {
        self.backends.get(&id).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use lb_common::CT_PENDING_PACKET;

    use super::*;

    #[test]
    fn pending_counts_add_up_by_service_and_by_backend() {
        let mut p = Pending::default();
        p.add(3, 5, 2 * CT_PENDING_PACKET + 100);
        p.add(3, 6, CT_PENDING_PACKET + 60);
        p.add(4, 5, 0);
        assert_eq!(
            p.service(3),
            Counter {
                packets: 3,
                bytes: 160
            }
        );
        assert_eq!(
            (
                p.backend(5).packets,
                p.backend(5).bytes,
                p.backend(6).packets
            ),
            (2, 100, 1)
        );
        assert_eq!(p.service(4), Counter::default());
    }
}
