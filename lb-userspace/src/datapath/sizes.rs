//! Map sizes from flags and the config file. A pinned map keeps the size it was created
//! with: an agent asked for another size refuses to start, naming the map and both sizes,
//! rather than silently running with the old one or dropping its flows.

use std::path::Path;

use lb_common::{
    AFFINITY_MAP_CAPACITY, BACKEND_MAP_CAPACITY, FilterSize, MAP_ADDR_FILTER, MAP_AFFINITY,
    MAP_BACKEND, MAP_BACKEND_STATS, MAP_CT, MAP_CT_ASSURED, MAP_CT6, MAP_CT6_ASSURED, MAP_SLOT,
    MAP_SVC, MAP_SVC_STATS, SVC_NAME_MAP_CAPACITY,
};

use super::{
    DatapathError,
    rows::{self, Strides},
};

/// kube-proxy's `conntrack.maxPerCore` default.
pub const CONNTRACK_MAX_PER_CORE: u32 = 32_768;
/// kube-proxy's `conntrack.min` default.
pub const CONNTRACK_MIN: u32 = 131_072;

/// The sizes (max entries) of the maps that can be sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Conntrack entries (two per flow), of the LRU table and of the assured table each, for
    /// each family.
    pub conntrack: u32,
    /// Service map entries (one per frontend, each scope).
    pub services: u32,
    /// Slot array elements (one per backend slot of every frontend, in power-of-two
    /// ranges).
    pub slots: u32,
    /// Backends (and their per-backend counters).
    pub backends: u32,
    /// ClientIP affinity entries (one per client and service).
    pub affinity: u32,
    /// Service ports (frontends): the per-service counters, indexed by service index
    /// (`1..service_ports`).
    pub service_ports: u32,
    /// Maglev tables (64 KiB of kernel memory each, allocated as they are written).
    pub maglev: u32,
    /// The address filters' size when one is already pinned (it is kept: the agent
    /// rewrites the filters whole, any size works); `None`: sized from the capacities.
    pub filter: Option<FilterSize>,
    /// The service map's size was asked for (a flag). When not, a service map pinned with
    /// another size keeps its size ([`MapSizes::keeping_pinned`]): a new default never
    /// stops an agent on its own pins.
    pub services_asked: bool,
    /// The same for the per-service arrays (theirs derives from the service map's).
    pub service_ports_asked: bool,
}

/// The per-service arrays' size for a service map of `services` entries when none is
/// asked for: one service index per entry (a frontend takes one index, one entry per
/// scope), at least the default, 65,536. A frontend past it is not programmed and
/// reported, naming the map and its capacity.
pub fn service_ports_for(services: u32) -> u32 {
    services.max(SVC_NAME_MAP_CAPACITY)
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            conntrack: conntrack_entries(CONNTRACK_MAX_PER_CORE, CONNTRACK_MIN, 1),
            services: lb_common::SVC_MAP_CAPACITY,
            slots: lb_common::SLOT_MAP_CAPACITY,
            backends: BACKEND_MAP_CAPACITY,
            affinity: AFFINITY_MAP_CAPACITY,
            service_ports: SVC_NAME_MAP_CAPACITY,
            maglev: lb_common::MAGLEV_MAP_CAPACITY,
            filter: None,
            services_asked: false,
            service_ports_asked: false,
        }
    }
}

/// Conntrack entries for kube-proxy's semantics: `max(maxPerCore × CPUs, min)` flows
/// (`maxPerCore` 0: `min`), two entries each (forward and reply).
pub fn conntrack_entries(max_per_core: u32, min: u32, cpus: u32) -> u32 {
    let flows = max_per_core.saturating_mul(cpus).max(min).max(1);
    flows.saturating_mul(2)
}

impl MapSizes {
    /// Each sized map's name and size (max entries) on a machine with `cpus` possible CPUs:
    /// the counter arrays hold a row per CPU.
    pub fn by_map(&self, cpus: u32) -> [(&'static str, u32); 12] {
        [
            (MAP_CT, self.conntrack),
            (MAP_CT_ASSURED, self.conntrack),
            (MAP_CT6, self.conntrack),
            (MAP_CT6_ASSURED, self.conntrack),
            (MAP_SVC, self.services),
            (MAP_SLOT, self.slots),
            (MAP_BACKEND, self.backends),
            (MAP_BACKEND_STATS, rows::entries(self.backends, cpus)),
            (MAP_AFFINITY, self.affinity),
            (MAP_SVC_STATS, rows::entries(self.service_ports, cpus)),
            (lb_common::MAP_MAGLEV, self.maglev),
            (MAP_ADDR_FILTER, self.filter().entries()),
        ]
    }

    /// The address filters' sizes: a pinned filter's, else four bits per address the
    /// per-service arrays can hold for the frontends' filter, and the backend map or those
    /// arrays, the larger, for the backends' (the default capacities keep the default, 2^20
    /// bits each).
    pub fn filter(&self) -> FilterSize {
        self.filter
            .unwrap_or_else(|| FilterSize::for_maps(self.service_ports, self.backends))
    }

    /// These sizes with what is pinned under `dir` kept where it may be: the address
    /// filters always (see [`MapSizes::keeping_pinned_filter`]); the service map and the
    /// per-service arrays each when no flag asked for its size (an agent whose default
    /// changed keeps the maps an earlier one sized). Machines with `cpus` CPUs.
    pub fn keeping_pinned(self, dir: &Path, cpus: u32) -> Result<Self, DatapathError> {
        let mut sizes = self.keeping_pinned_filter(dir)?;
        if !sizes.services_asked
            && let Some(n) = pinned_entries(dir, MAP_SVC)?
        {
            sizes.services = n;
        }
        if !sizes.service_ports_asked
            && let Some(n) = pinned_entries(dir, MAP_SVC_STATS)?
        {
            sizes.service_ports = n / cpus.max(1);
        }
        if (sizes.services, sizes.service_ports) != (self.services, self.service_ports) {
            tracing::info!(
                services = sizes.services,
                service_ports = sizes.service_ports,
                "the pinned service map and per-service arrays keep their sizes (--service-map-max or --service-ports-max resizes them, after `xlb cleanup`)"
            );
        }
        Ok(sizes)
    }

    /// These sizes with the address filters' kept as pinned under `dir`, if they are: a
    /// filter pinned with other capacities keeps its size rather than refusing the start;
    /// one of the layout before (`prev::MAP_ADDR_FILTER`, two filters of one size) gives its
    /// size to this layout's, which takes its bits over (`upgrade::adopt_filter`); new pins
    /// get theirs.
    pub fn keeping_pinned_filter(self, dir: &Path) -> Result<Self, DatapathError> {
        let pinned = match pinned_entries(dir, MAP_ADDR_FILTER)? {
            Some(n) => Some(n),
            None => pinned_entries(dir, lb_common::prev::MAP_ADDR_FILTER)?,
        };
        let Some(entries) = pinned else {
            return Ok(self);
        };
        let pinned = FilterSize::from_entries(entries);
        let wanted = self.filter();
        if pinned != wanted {
            tracing::info!(
                map = MAP_ADDR_FILTER,
                pinned = ?pinned,
                sized = ?wanted,
                "the pinned address filters keep their size (removing the pins, `xlb cleanup`, sizes them anew)"
            );
        }
        Ok(Self {
            filter: Some(pinned),
            ..self
        })
    }

    /// The strides of the counter arrays (their indices per CPU).
    pub fn strides(&self) -> Strides {
        Strides {
            svc: self.service_ports,
            backend: self.backends,
            filter_log2: self.filter().global(),
        }
    }

    /// Refuses when a map already pinned under `dir` has another size than asked for.
    pub fn check_pinned(&self, dir: &Path, cpus: u32) -> Result<(), DatapathError> {
        for (name, wanted) in self.by_map(cpus) {
            let Some(pinned) = pinned_entries(dir, name)? else {
                continue;
            };
            if pinned != wanted {
                return Err(DatapathError::SizeChanged {
                    map: name,
                    pinned,
                    wanted,
                    dir: dir.to_path_buf(),
                });
            }
        }
        Ok(())
    }
}

/// The max entries of map `name` pinned under `dir`, if it is.
fn pinned_entries(dir: &Path, name: &'static str) -> Result<Option<u32>, DatapathError> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    aya::maps::MapData::from_pin(&path)
        .and_then(|m| m.info())
        .map(|info| Some(info.max_entries()))
        .map_err(|source| DatapathError::Map { name, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_follows_kube_proxy() {
        // Two CPUs: the minimum wins; 64 CPUs: max per core × CPUs; two entries a flow.
        assert_eq!(conntrack_entries(32_768, 131_072, 2), 262_144);
        assert_eq!(conntrack_entries(32_768, 131_072, 64), 4_194_304);
        assert_eq!(conntrack_entries(0, 1_000, 8), 2_000);
    }

    #[test]
    fn per_service_arrays_follow_the_service_map() {
        // One service index per service map entry: the defaults agree.
        assert_eq!(
            service_ports_for(lb_common::SVC_MAP_CAPACITY),
            SVC_NAME_MAP_CAPACITY
        );
        assert_eq!(service_ports_for(1 << 19), 1 << 19);
        assert_eq!(service_ports_for(1_000), SVC_NAME_MAP_CAPACITY);
    }
}
