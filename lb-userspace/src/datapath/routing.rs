//! Whether this namespace's routes depend on the destination alone: what lets XDP keep the
//! way out toward a backend per backend (`lb-ebpf`'s `fib::backend_hop`, the node config's
//! `CFG_F_ROUTES_BY_DST` and `CFG_F_ROUTES6_BY_DST`) instead of looking each new flow's
//! route up with its client's address.
//!
//! XDP's route lookup varies between two flows to one backend entering on one interface
//! only by the source address (its request carries no ports, TOS or mark, and the
//! protocol is the backend's). So a family's routes are the same for every client unless
//! an `ip rule` of the family selects by source (`from PREFIX`; a CNI's per-pod or
//! per-interface-address rules) or, for IPv6, a route has a source prefix
//! (`ip -6 route add … from …`, source-specific routing). Rules by input interface are
//! fine: the per-backend way is kept per ingress interface too. Read from an rtnetlink
//! dump of the rules (both families) and of the IPv6 routes, at start and whenever the
//! link watch (`netif::watch_links`) sees a rule, or an IPv6 route with a source prefix,
//! come or go.

use lb_common::{CFG_F_ROUTES_BY_DST, CFG_F_ROUTES6_BY_DST};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage as Rt, route::RouteMessage, rule::RuleMessage,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::netlink::dump;

/// What selects a family's routes by source: rules `from` a prefix, IPv6 routes with one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BySource {
    pub v4: bool,
    pub v6: bool,
}

impl BySource {
    /// Takes in one rule or route of a dump (or of an event: one that sets a family is a
    /// change that matters, `netif::watch_links`).
    pub fn see(&mut self, m: &Rt) {
        let family = match m {
            Rt::NewRule(r) | Rt::DelRule(r) | Rt::GetRule(r) if r.header.src_len != 0 => {
                r.header.family
            }
            Rt::NewRoute(r) | Rt::DelRoute(r) | Rt::GetRoute(r)
                if r.header.source_prefix_length != 0 =>
            {
                r.header.address_family
            }
            _ => return,
        };
        match family {
            AddressFamily::Inet => self.v4 = true,
            AddressFamily::Inet6 => self.v6 = true,
            _ => {}
        }
    }

    /// The node config flags of the families whose routes depend on the destination alone.
    pub fn flags(self) -> u32 {
        (if self.v4 { 0 } else { CFG_F_ROUTES_BY_DST })
            | (if self.v6 { 0 } else { CFG_F_ROUTES6_BY_DST })
    }
}

/// The node config flags (`CFG_F_ROUTES_BY_DST`, `CFG_F_ROUTES6_BY_DST`) of the families
/// whose routes in this process's namespace depend on the destination alone. A dump that
/// fails sets neither (every flow's route is then looked up with its source, as without
/// the flags), with a warning.
pub fn by_destination() -> u32 {
    match dump_all() {
        Ok(seen) => seen.flags(),
        Err(e) => {
            tracing::warn!(
                "cannot read the routing rules over rtnetlink: {e}; XDP looks every new flow's route up"
            );
            0
        }
    }
}

/// The rules of both families and the IPv6 routes (every table), through one socket.
fn dump_all() -> std::io::Result<BySource> {
    let mut sock = Socket::new(NETLINK_ROUTE)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    let mut seen = BySource::default();
    // AF_UNSPEC: every family's rules.
    dump(&sock, Rt::GetRule(RuleMessage::default()), |m| seen.see(&m))?;
    let mut route = RouteMessage::default();
    route.header.address_family = AddressFamily::Inet6;
    if let Err(e) = dump(&sock, Rt::GetRoute(route), |m| seen.see(&m)) {
        // IPv6 off (no such family): nothing to keep per backend; else unknown.
        tracing::debug!("cannot read the IPv6 routes: {e}; IPv6 routes looked up per flow");
        seen.v6 = true;
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(family: AddressFamily, src_len: u8) -> Rt {
        let mut r = RuleMessage::default();
        r.header.family = family;
        r.header.src_len = src_len;
        Rt::NewRule(r)
    }

    fn route6(src_len: u8) -> Rt {
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet6;
        r.header.destination_prefix_length = 64;
        r.header.source_prefix_length = src_len;
        Rt::NewRoute(r)
    }

    #[test]
    fn only_a_source_selector_makes_a_family_route_by_source() {
        let mut seen = BySource::default();
        // The default rules (`from all`) and plain routes.
        seen.see(&rule(AddressFamily::Inet, 0));
        seen.see(&rule(AddressFamily::Inet6, 0));
        seen.see(&route6(0));
        assert_eq!(seen.flags(), CFG_F_ROUTES_BY_DST | CFG_F_ROUTES6_BY_DST);
        // A CNI's `from 10.244.1.7/32 lookup 100`: IPv4 only.
        seen.see(&rule(AddressFamily::Inet, 32));
        assert_eq!(seen.flags(), CFG_F_ROUTES6_BY_DST);
        // Source-specific IPv6 routing.
        let mut seen = BySource::default();
        seen.see(&route6(48));
        assert_eq!(seen.flags(), CFG_F_ROUTES_BY_DST);
    }

    /// This process's namespace (the test's, the host's default rules at least) answers
    /// both dumps.
    #[test]
    fn the_namespace_answers_the_dumps() {
        dump_all().expect("rtnetlink dumps of rules and IPv6 routes");
    }
}
