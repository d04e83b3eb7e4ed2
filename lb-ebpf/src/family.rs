//! What the family-independent datapath steps (`conntrack.rs`'s flow logic) need of an
//! address family: its address ([`Addr`]: IPv4's `u32`, IPv6's `[u32; 4]`), the tuple
//! fields its keys, entries and parsed packets share by name ([`Ends`], [`Entry`]), and its
//! tables and scratch ([`Flow`], implemented by the parsed tuple: IPv4's `Tuple` in
//! `conntrack.rs`, IPv6's `Tuple6` in `v6/conntrack.rs`). Everything here is
//! `#[inline(always)]`: generic code compiles to what the family's own code was.

use aya_ebpf::programs::{TcContext, XdpContext};
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{HashMap, LruHashMap},
};
use lb_common::{
    Backend, CT_MAP_CAPACITY, CtKey, CtKey6, CtValue, CtValue6, IPPROTO_SCTP, IPPROTO_TCP,
    NodeConfig,
};

use crate::{
    affinity::ClientOf,
    fib::{self, Route, RouteAddr, Way},
    maps::Chosen,
    packet::Packet,
    parse::{ETH_HLEN, Tuple},
    quote::Quote,
    reason::Reason,
    select::Keyed,
    shared::Shared,
    v6::parse::Tuple6,
};

pub use crate::addr::Addr;

/// The 4-tuple a conntrack key, a conntrack entry and a parsed packet share (fields
/// `saddr_be`, `daddr_be`, `sport_be`, `dport_be` in each), read.
pub trait Ends {
    type Addr: Addr;
    fn saddr(&self) -> &Self::Addr;
    fn daddr(&self) -> &Self::Addr;
    fn sport(&self) -> u16;
    fn dport(&self) -> u16;
}

/// The four fields of a value of this run's own (a key, the scratch's entries), writable.
pub trait EndsMut: Ends {
    fn ends_mut(&mut self) -> (&mut Self::Addr, &mut Self::Addr, &mut u16, &mut u16);
}

macro_rules! ends {
    ($t:ty, $a:ty) => {
        impl Ends for $t {
            type Addr = $a;
            #[inline(always)]
            fn saddr(&self) -> &$a {
                &self.saddr_be
            }
            #[inline(always)]
            fn daddr(&self) -> &$a {
                &self.daddr_be
            }
            #[inline(always)]
            fn sport(&self) -> u16 {
                self.sport_be
            }
            #[inline(always)]
            fn dport(&self) -> u16 {
                self.dport_be
            }
        }
        impl EndsMut for $t {
            #[inline(always)]
            fn ends_mut(&mut self) -> (&mut $a, &mut $a, &mut u16, &mut u16) {
                (
                    &mut self.saddr_be,
                    &mut self.daddr_be,
                    &mut self.sport_be,
                    &mut self.dport_be,
                )
            }
        }
    };
}
ends!(CtKey, u32);
ends!(CtValue, u32);
ends!(Tuple, u32);
ends!(CtKey6, [u32; 4]);
ends!(CtValue6, [u32; 4]);
ends!(Tuple6, [u32; 4]);

/// What the flow steps read of a conntrack entry beyond its tuple (the fields both layouts
/// share): of a value of the run's own, or of a map value through its [`Shared`] pointer.
pub trait View: Ends {
    fn flags(&self) -> u16;
    fn mtu(&self) -> u16;
    fn last_seen_ns(&self) -> u64;
    fn created_ns(&self) -> u64;
    /// The backend's index and generation.
    fn backend(&self) -> (u32, u32);
    fn svc_id(&self) -> u32;
}

/// A conntrack entry's layout: its fields in a value of the run's own (the scratch's),
/// writable, and the places of its fields in a shared one ([`Entry::at`]).
pub trait Entry: View + EndsMut + Sized {
    fn flags_mut(&mut self) -> &mut u16;
    fn last_seen_mut(&mut self) -> &mut u64;
    fn created_mut(&mut self) -> &mut u64;
    fn mtu_mut(&mut self) -> &mut u16;
    /// A new forward entry's fields beyond its tuple and times: its backend (index and
    /// generation) and service index, no flags, no MTU.
    fn start(&mut self, backend_id: u32, backend_gen: u32, svc_id: u32);
    /// `*self = *src`, field by field (a struct copy from a map value compiles to a
    /// `memmove` whose overlap check subtracts pointers), each read through the pointer.
    fn copy_from(&mut self, src: &Shared<'_, Self>);
    /// `*self = *src` for two values of the run's own, field by field (as `copy_from`).
    fn copy_from_local(&mut self, src: &Self);
    /// The places of the fields of the value `p` points to (no reference to it is made).
    fn at(p: *mut Self) -> Places<Self::Addr>;
}

/// The places of a shared conntrack entry's fields ([`Entry::at`]).
pub struct Places<A> {
    pub saddr: *const A,
    pub daddr: *const A,
    pub sport: *const u16,
    pub dport: *const u16,
    pub flags: *mut u16,
    pub mtu: *mut u16,
    pub last_seen: *mut u64,
    pub pending: *mut u32,
    pub created: *const u64,
    pub backend_id: *const u32,
    pub backend_gen: *const u32,
    pub svc_id: *const u32,
}

macro_rules! entry {
    ($t:ty) => {
        impl View for $t {
            #[inline(always)]
            fn flags(&self) -> u16 {
                self.flags
            }
            #[inline(always)]
            fn mtu(&self) -> u16 {
                self.mtu
            }
            #[inline(always)]
            fn last_seen_ns(&self) -> u64 {
                self.last_seen_ns
            }
            #[inline(always)]
            fn created_ns(&self) -> u64 {
                self.created_ns
            }
            #[inline(always)]
            fn backend(&self) -> (u32, u32) {
                (self.backend_id, self.backend_gen)
            }
            #[inline(always)]
            fn svc_id(&self) -> u32 {
                self.svc_id
            }
        }
        impl Entry for $t {
            #[inline(always)]
            fn flags_mut(&mut self) -> &mut u16 {
                &mut self.flags
            }
            #[inline(always)]
            fn last_seen_mut(&mut self) -> &mut u64 {
                &mut self.last_seen_ns
            }
            #[inline(always)]
            fn created_mut(&mut self) -> &mut u64 {
                &mut self.created_ns
            }
            #[inline(always)]
            fn mtu_mut(&mut self) -> &mut u16 {
                &mut self.mtu
            }
            #[inline(always)]
            fn start(&mut self, backend_id: u32, backend_gen: u32, svc_id: u32) {
                self.backend_id = backend_id;
                self.backend_gen = backend_gen;
                self.svc_id = svc_id;
                self.flags = 0;
                self.mtu = 0;
                self.pending = 0;
            }
            #[inline(always)]
            fn copy_from(&mut self, src: &Shared<'_, Self>) {
                self.saddr_be.set(src.saddr());
                self.daddr_be.set(src.daddr());
                self.sport_be = src.sport();
                self.dport_be = src.dport();
                (self.backend_id, self.backend_gen) = src.backend();
                self.svc_id = src.svc_id();
                self.flags = src.flags();
                self.mtu = src.mtu();
                // Only an assured entry has pending counts, and `promote` copies LRU ones.
                self.pending = 0;
                self.created_ns = src.created_ns();
                self.last_seen_ns = src.last_seen_ns();
            }
            #[inline(always)]
            fn copy_from_local(&mut self, src: &Self) {
                self.saddr_be.set(&src.saddr_be);
                self.daddr_be.set(&src.daddr_be);
                self.sport_be = src.sport_be;
                self.dport_be = src.dport_be;
                self.backend_id = src.backend_id;
                self.backend_gen = src.backend_gen;
                self.svc_id = src.svc_id;
                self.flags = src.flags;
                self.mtu = src.mtu;
                self.pending = 0;
                self.created_ns = src.created_ns;
                self.last_seen_ns = src.last_seen_ns;
            }
            #[inline(always)]
            fn at(p: *mut Self) -> Places<Self::Addr> {
                // SAFETY: only the fields' addresses are computed, of the value `p` points
                // to (a live one: a Shared's).
                unsafe {
                    Places {
                        saddr: &raw const (*p).saddr_be,
                        daddr: &raw const (*p).daddr_be,
                        sport: &raw const (*p).sport_be,
                        dport: &raw const (*p).dport_be,
                        flags: &raw mut (*p).flags,
                        mtu: &raw mut (*p).mtu,
                        last_seen: &raw mut (*p).last_seen_ns,
                        pending: &raw mut (*p).pending,
                        created: &raw const (*p).created_ns,
                        backend_id: &raw const (*p).backend_id,
                        backend_gen: &raw const (*p).backend_gen,
                        svc_id: &raw const (*p).svc_id,
                    }
                }
            }
        }
    };
}
entry!(CtValue);
entry!(CtValue6);

/// A shared entry's tuple: never written in place (an entry is replaced whole), so lent for
/// as long as the `Shared` is borrowed (see `shared.rs`).
impl<V: Entry> Ends for Shared<'_, V> {
    type Addr = V::Addr;
    #[inline(always)]
    fn saddr(&self) -> &V::Addr {
        // SAFETY: a Shared points to a live value; the field is never written in place.
        unsafe { &*V::at(self.as_ptr()).saddr }
    }
    #[inline(always)]
    fn daddr(&self) -> &V::Addr {
        // SAFETY: as `saddr`.
        unsafe { &*V::at(self.as_ptr()).daddr }
    }
    #[inline(always)]
    fn sport(&self) -> u16 {
        // SAFETY: as `saddr`.
        unsafe { V::at(self.as_ptr()).sport.read() }
    }
    #[inline(always)]
    fn dport(&self) -> u16 {
        // SAFETY: as `saddr`.
        unsafe { V::at(self.as_ptr()).dport.read() }
    }
}

/// A shared entry's other fields: those written in place (`flags`, `mtu`, `last_seen_ns`)
/// read volatile, into a local.
impl<V: Entry> View for Shared<'_, V> {
    #[inline(always)]
    fn flags(&self) -> u16 {
        // SAFETY: a Shared points to a live value; one volatile load.
        unsafe { V::at(self.as_ptr()).flags.read_volatile() }
    }
    #[inline(always)]
    fn mtu(&self) -> u16 {
        // SAFETY: as `flags`.
        unsafe { V::at(self.as_ptr()).mtu.read_volatile() }
    }
    #[inline(always)]
    fn last_seen_ns(&self) -> u64 {
        // SAFETY: as `flags`.
        unsafe { V::at(self.as_ptr()).last_seen.read_volatile() }
    }
    #[inline(always)]
    fn created_ns(&self) -> u64 {
        // SAFETY: a Shared points to a live value; the field is never written in place.
        unsafe { V::at(self.as_ptr()).created.read() }
    }
    #[inline(always)]
    fn backend(&self) -> (u32, u32) {
        let at = V::at(self.as_ptr());
        // SAFETY: as `created_ns`.
        unsafe { (at.backend_id.read(), at.backend_gen.read()) }
    }
    #[inline(always)]
    fn svc_id(&self) -> u32 {
        // SAFETY: as `created_ns`.
        unsafe { V::at(self.as_ptr()).svc_id.read() }
    }
}

/// The writes into a shared entry: its fields written in place, each one volatile store.
impl<V: Entry> Shared<'_, V> {
    #[inline(always)]
    pub fn set_flags(&self, flags: u16) {
        // SAFETY: a Shared points to a live value; one volatile store.
        unsafe { V::at(self.as_ptr()).flags.write_volatile(flags) }
    }
    /// Sets `bits` in `flags` (read, or-ed, written: a concurrent writer's bits may be lost,
    /// as with the plain `|=` before; each CPU sets only bits of what it saw).
    #[inline(always)]
    pub fn add_flags(&self, bits: u16) {
        self.set_flags(self.flags() | bits);
    }
    #[inline(always)]
    pub fn set_mtu(&self, mtu: u16) {
        // SAFETY: as `set_flags`.
        unsafe { V::at(self.as_ptr()).mtu.write_volatile(mtu) }
    }
    #[inline(always)]
    pub fn set_last_seen(&self, ns: u64) {
        // SAFETY: as `set_flags`.
        unsafe { V::at(self.as_ptr()).last_seen.write_volatile(ns) }
    }
    /// The pending counts (`CtValue::pending`), one volatile load.
    #[inline(always)]
    pub fn pending(&self) -> u32 {
        // SAFETY: as `flags`.
        unsafe { V::at(self.as_ptr()).pending.read_volatile() }
    }
    /// Adds `n` to the pending counts (wrapping: a flush adds what it read, negated), one
    /// atomic add: every CPU may add at once, and none loses another's.
    #[inline(always)]
    pub fn add_pending(&self, n: u32) {
        // SAFETY: a Shared points to a live value; the field is only ever written by atomic
        // adds (and whole-value inserts). The result is unused: a plain atomic add (BPF's
        // `lock xadd`), which every BPF CPU version has.
        unsafe {
            core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(
                V::at(self.as_ptr()).pending,
                n,
            );
        }
    }
}

/// A conntrack key's fields beyond its tuple.
pub trait Key: EndsMut {
    fn proto(&self) -> u8;
    /// `CT_DIR_FORWARD` or `CT_DIR_REPLY`.
    fn dir_mut(&mut self) -> &mut u8;
}

macro_rules! key {
    ($t:ty) => {
        impl Key for $t {
            #[inline(always)]
            fn proto(&self) -> u8 {
                self.proto
            }
            #[inline(always)]
            fn dir_mut(&mut self) -> &mut u8 {
                &mut self.dir
            }
        }
    };
}
key!(CtKey);
key!(CtKey6);

/// A family's LRU conntrack table (`XLB_CT_V3`, `XLB_CT6_V1`).
pub type CtTable<K, V> = LruHashMap<K, V, { CT_MAP_CAPACITY as usize }>;
/// A family's assured table (`XLB_CTA_V1`, `XLB_CTA6_V1`).
pub type CtaTable<K, V> =
    HashMap<K, V, { CT_MAP_CAPACITY as usize }, { BPF_F_NO_PREALLOC as usize }>;

/// The scratch fields a new flow's entries are built in (`FlowScratch`, `FlowScratch6`),
/// and the backend it goes to (chosen by one step, recorded by the next).
pub struct Parts<'a, K, V> {
    pub fwd: &'a mut V,
    pub reply: &'a mut V,
    pub fwd_key: &'a mut K,
    pub reply_key: &'a mut K,
    pub chosen: &'a mut Chosen,
}

/// A family, as its parsed packet's tuple knows it: what the packet says (protocol, TCP
/// flags, its tuple through [`Ends`]) and where its flows live.
pub trait Flow: Ends {
    type Key: Key<Addr = Self::Addr> + 'static;
    type Value: Entry<Addr = Self::Addr> + 'static;
    /// The family's flow scratch (a field of `work::WorkArea`).
    type Scratch: 'static;
    /// The quote of an ICMP error about the family's packet (`quote.rs`).
    type Quote: Quote;
    fn proto(&self) -> u8;
    fn tcp_flags(&self) -> u8;
    /// The LRU table and the assured table.
    fn ct() -> &'static CtTable<Self::Key, Self::Value>;
    fn cta() -> &'static CtaTable<Self::Key, Self::Value>;
    /// The conntrack fields of the scratch.
    fn parts(s: &mut Self::Scratch) -> Parts<'_, Self::Key, Self::Value>;
    /// The scratch's quote as received, as translated, and the key it is looked up by.
    fn quotes(s: &mut Self::Scratch) -> (&mut Self::Quote, &mut Self::Quote, &mut Self::Key);
    fn key(
        saddr: &Self::Addr,
        daddr: &Self::Addr,
        sport: u16,
        dport: u16,
        proto: u8,
        dir: u8,
    ) -> Self::Key;
}

/// Implements [`Flow`] for a family's tuple `$tuple`: its key and entry types, its LRU and
/// assured tables, its flow scratch type `$scratch` and the quote type `$quote` in it; the
/// field names are both families'.
macro_rules! flow {
    ($tuple:ty, $key:ident, $value:ty, $scratch:ty, $quote:ty, $ct:expr, $cta:expr) => {
        impl $crate::family::Flow for $tuple {
            type Key = $key;
            type Value = $value;
            type Scratch = $scratch;
            type Quote = $quote;
            #[inline(always)]
            fn proto(&self) -> u8 {
                self.proto
            }
            #[inline(always)]
            fn tcp_flags(&self) -> u8 {
                self.tcp_flags
            }
            #[inline(always)]
            fn ct() -> &'static $crate::family::CtTable<$key, $value> {
                &$ct
            }
            #[inline(always)]
            fn cta() -> &'static $crate::family::CtaTable<$key, $value> {
                &$cta
            }
            #[inline(always)]
            fn parts(s: &mut $scratch) -> $crate::family::Parts<'_, $key, $value> {
                $crate::family::Parts {
                    fwd: &mut s.fwd,
                    reply: &mut s.reply,
                    fwd_key: &mut s.fwd_key,
                    reply_key: &mut s.reply_key,
                    chosen: &mut s.chosen,
                }
            }
            #[inline(always)]
            fn quotes(s: &mut $scratch) -> (&mut $quote, &mut $quote, &mut $key) {
                (&mut s.quote_old, &mut s.quote_new, &mut s.fwd_key)
            }
            #[inline(always)]
            fn key(
                s: &Self::Addr,
                d: &Self::Addr,
                sport: u16,
                dport: u16,
                proto: u8,
                dir: u8,
            ) -> $key {
                $key {
                    saddr_be: *s,
                    daddr_be: *d,
                    sport_be: sport,
                    dport_be: dport,
                    proto,
                    dir,
                    _pad: 0,
                }
            }
        }
    };
}
pub(crate) use flow;

/// An ICMP message as a family's parse leaves it (IPv4's `parse::Icmp`, IPv6's tuple): what
/// the ICMP translation (`icmp.rs`) reads of it.
pub trait Message {
    type Addr: Addr;
    /// Its source and destination addresses.
    fn addrs(&self) -> (&Self::Addr, &Self::Addr);
    /// Offset of the ICMP header.
    fn icmp_off(&self) -> usize;
    /// Where the IP packet ends: its Ethernet and IP headers and its payload.
    fn end(&self) -> usize;
    /// An error that quotes the packet it is about (destination unreachable, fragmentation
    /// needed / Packet Too Big, time exceeded).
    fn quotes_packet(&self, ctx: &TcContext) -> Result<bool, Reason>;
}

/// What the route-MTU check says about a packet about to be translated toward a backend.
pub enum Mtu {
    /// Not checked: small, no DF, a GSO super-packet, it fits the cached MTU, or no route.
    Unchecked,
    /// It fits: this size is worth remembering in the flow's entry.
    Fits(u16),
    /// It does not fit: answer fragmentation needed with this MTU before translating it.
    TooBig(u16),
}

/// An address family, as the one flow of each hook asks it (implemented by the parsed
/// packet's tuple: IPv4's in `v4.rs`, IPv6's in `v6/family.rs`). Only what truly differs
/// between the families is here: which word the address filters hash, a loopback frontend,
/// the service-map frontend, the source-range trie, the header's offsets, its addresses'
/// rewrite (IPv4's header checksum), the DSR option, the answers
/// built in its header (refusal, fragmentation needed / Packet Too Big), and the layout of
/// the packet an ICMP error quotes. The route lookups
/// (`fib.rs`, generic over the address) and the defaults here are written once. Every step
/// that uses it is generic over it and monomorphised per family.
pub trait Family: Flow + Ends<Addr: RouteAddr> + ClientOf + Sized + 'static {
    /// The frontend as the service map keys it.
    type Front: Keyed;
    /// Bytes the DSR option adds to a packet that carries it.
    const DSR_LEN: u16;
    /// The word the address filters hash for `a` (`filter::maybe_*`).
    fn filter_word(a: &Self::Addr) -> u32;
    /// `a` is unset (all zero).
    #[inline(always)]
    fn is_zero(a: &Self::Addr) -> bool {
        a.is_zero()
    }
    /// A loopback frontend: those exist for the node's own sockets only.
    fn is_loopback(a: &Self::Addr) -> bool;
    /// The frontend `addr`:`port_be` of protocol `proto`, in `scope`.
    fn front(addr: &Self::Addr, port_be: u16, proto: u8, scope: u8) -> Self::Front;
    /// The frontend the packet is sent to, in `scope`.
    #[inline(always)]
    fn frontend(&self, scope: u8) -> Self::Front {
        Self::front(self.daddr(), self.dport(), self.proto(), scope)
    }
    /// The Maglev hash of the packet's flow (`lb_common::flow_hash`, IPv4's addresses in
    /// word 0).
    #[inline(always)]
    fn flow_hash(&self) -> u32 {
        let (s, d) = (self.saddr().words(), self.daddr().words());
        lb_common::flow_hash(&s, &d, self.sport(), self.dport(), self.proto())
    }
    /// The backend's address in this family.
    fn backend_addr(be: &Backend) -> &Self::Addr;
    /// Whether the client falls in the source ranges of service index `svc_id`.
    fn src_allowed(&self, svc_id: u32) -> bool;
    /// The family's hairpin address (all zero: hairpin off).
    fn hairpin(cfg: &NodeConfig) -> Self::Addr;
    /// A packet without IP options or extension headers (where a DSR option may go).
    #[inline(always)]
    fn plain(&self) -> bool {
        self.l4_off() == Self::L4_OFF
    }
    /// Packets up to this size are not checked against the route MTU (IPv4: 576, no link
    /// is smaller; IPv6: 1280, its minimum link MTU).
    const MIN_CHECKED: u32;
    /// The packet must be answered, not fragmented, when too big for its route (IPv4: DF
    /// set; IPv6: always, no router fragments it).
    fn df(&self) -> bool;
    /// Offset of the L4 header.
    fn l4_off(&self) -> usize;
    /// The route toward `daddr` for a packet of `len` bytes: its MTU and whether the packet
    /// is too big for it (`None`: no route here, the stack decides).
    #[inline(always)]
    fn route_mtu<P: Packet>(&self, ctx: &P, daddr: &Self::Addr, len: u16) -> Option<(u16, bool)> {
        let r = self.route(ctx, daddr, len)?;
        Some((r.mtu, r.too_big != 0))
    }
    /// The route from the packet's source toward `daddr` entering here, `len` checked
    /// against its MTU (0: not checked), the neighbour not resolved.
    #[inline(always)]
    fn route<P: Packet>(&self, ctx: &P, daddr: &Self::Addr, len: u16) -> Option<Route<Self::Addr>> {
        let here = ctx.ingress_ifindex();
        fib::lookup(
            ctx.raw(),
            here,
            self.proto(),
            self.saddr(),
            daddr,
            len,
            false,
        )
    }

    /// Checks the packet against the route to `daddr` (its MTU, as the kernel's forwarding
    /// would), unless it is no bigger than `fits`, a size already known to fit (0 = none). A
    /// GSO super-packet is checked by the size of its segments. `extra`: bytes the packet
    /// gains on its way (a DSR option, `dsr::extra`), counted in its size and taken off the
    /// MTU a too-big packet is answered with.
    #[inline(always)]
    fn check_mtu<P: Packet>(&self, ctx: &P, daddr: &Self::Addr, fits: u16, extra: u16) -> Mtu {
        if !self.df() {
            return Mtu::Unchecked;
        }
        let gso = ctx.gso_size();
        let len = if gso == 0 {
            self.ip_len() as u32
        } else {
            let l4_hdr = if self.proto() == IPPROTO_TCP {
                ctx.load::<u8>(self.l4_off() + 12)
                    .map_or(20, |d| ((d >> 4) as u32) * 4)
            } else if self.proto() == IPPROTO_SCTP {
                12
            } else {
                8
            };
            (self.l4_off() - ETH_HLEN) as u32 + l4_hdr + gso
        } + extra as u32;
        if len <= Self::MIN_CHECKED || len <= fits as u32 || len > u16::MAX as u32 {
            return Mtu::Unchecked;
        }
        match self.route_mtu(ctx, daddr, len as u16) {
            None => Mtu::Unchecked,
            Some((mtu, true)) => Mtu::TooBig(mtu.saturating_sub(extra)),
            Some((_, false)) => Mtu::Fits(len as u16),
        }
    }
    /// The node's source address on the route toward `daddr` (`None`: no route, or no
    /// address).
    #[inline(always)]
    fn route_src<P: Packet>(&self, ctx: &P, daddr: &Self::Addr) -> Option<Self::Addr> {
        let src = self.route(ctx, daddr, 0)?.src_be;
        (!Self::is_zero(&src)).then_some(src)
    }
    /// The bytes the direct rewrite needs in place (`[u8; N]`): Ethernet, the IP header
    /// without options or extension headers, and TCP's first 20 bytes (ports, flags,
    /// checksum), UDP's 8, SCTP's 16.
    type DirectTcp;
    type DirectUdp;
    type DirectSctp;
    /// Offset of the L4 header of a packet without IP options or extension headers.
    const L4_OFF: usize;
    /// The headers are in place at the fixed offsets (`l4_off == L4_OFF`, the bytes up to
    /// `DirectTcp`/`DirectUdp` linear): rewritten directly, not through helpers.
    fn direct(&self) -> bool;
    /// Offset of the L4 checksum.
    fn csum_off(&self) -> usize;
    /// The L4 length, its header included.
    fn l4_len(&self) -> u32;
    /// Writes `to`'s addresses of the `PART` side(s) where they differ from the packet's
    /// (`nat::rewrite`'s direct path); returns their change to the L4 pseudo-header's sum
    /// (IPv4: its header checksum updated too).
    ///
    /// # Safety
    /// `p` is the packet's start, checked against data_end for the IP header.
    unsafe fn addrs_in_place<const PART: u8>(
        &self,
        p: *mut u8,
        to: &Shared<'_, Self::Value>,
    ) -> u32;
    /// As [`Family::addrs_in_place`], through the store (and checksum) helpers.
    #[inline(always)]
    fn addrs_with_helpers<P: Packet, const PART: u8>(
        &self,
        ctx: &P,
        to: &Shared<'_, Self::Value>,
    ) -> Result<u32, Reason> {
        Self::readdress::<P, PART>(ctx, (self.saddr(), self.daddr()), (to.saddr(), to.daddr()))
    }
    /// Writes the addresses `to` (source, destination) of the `PART` side(s) where they
    /// differ from `from`, the packet's, through the store (and checksum) helpers; returns
    /// their change to the L4 pseudo-header's sum (IPv4: its header checksum updated too).
    fn readdress<P: Packet, const PART: u8>(
        ctx: &P,
        from: (&Self::Addr, &Self::Addr),
        to: (&Self::Addr, &Self::Addr),
    ) -> Result<u32, Reason>;
    /// Answers the packet with a refusal (TCP RST, port unreachable), built in the scratch
    /// where the family needs room; `back`: see `reject::refuse`.
    fn refuse(&self, ctx: &TcContext, s: &mut Self::Scratch, back: u64) -> Result<i32, Reason>;
    /// Answers the packet with fragmentation needed / Packet Too Big (`mtu`).
    fn too_big(&self, ctx: &TcContext, s: &mut Self::Scratch, mtu: u16) -> Result<i32, Reason>;
    /// ICMP's protocol number (ICMPv6's), and the type and code of port unreachable and of
    /// fragmentation needed / Packet Too Big: the answers of `reject.rs`.
    const ICMP_PROTO: u8;
    const PORT_UNREACH: (u8, u8);
    const TOO_BIG: (u8, u8);
    /// The unfolded sum an answer's checksum of `len` bytes of `proto` starts from: its
    /// pseudo-header (the packet's addresses: swapped, the same sum), or 0 where the family
    /// has none (IPv4's ICMP).
    #[inline(always)]
    fn answer_sum(&self, proto: u8, len: u32) -> u32 {
        if proto == Self::ICMP_PROTO && !Self::ICMP_PSEUDO {
            return 0;
        }
        self.daddr().sum16() + self.saddr().sum16() + len + proto as u32
    }
    /// Writes the IP header of an answer (`reject.rs`) from the packet's destination to its
    /// source, for `payload` bytes of `proto`, the packet already resized to it.
    fn answer_header(&self, ctx: &TcContext, proto: u8, payload: u16) -> Result<(), Reason>;
    /// An ICMP message as the family's parse leaves it (`icmp.rs` translates it).
    type Icmp: Message<Addr = Self::Addr>;
    /// ICMP's checksum covers the pseudo-header (ICMPv6's does, IPv4's ICMP's does not).
    const ICMP_PSEUDO: bool;
    /// Offsets in a quote ([`Flow::Quote`]) of the quoted protocol, source and destination
    /// addresses, and L4 header (its ports, then UDP's length and checksum).
    const Q_PROTO: usize;
    const Q_SRC: usize;
    const Q_DST: usize;
    const Q_L4: usize;
    /// The quote holds a header of the family without options or extension headers (its
    /// ports at `Q_L4`).
    fn quote_plain(q: &Self::Quote) -> bool;
    /// The quoted header's own checksum made right after its addresses changed (IPv4's;
    /// IPv6's header has none).
    fn quote_header_sum(q: &mut Self::Quote);
    /// DSR (`dsr.rs`): offset of the header word that says whether an option follows the
    /// header (IPv4's version and header length, TOS and total length; IPv6's payload
    /// length, next header and hop limit).
    const DSR_WORD_OFF: usize;
    /// Offset of the IP header's checksum (IPv4's; `None`: IPv6's header has none).
    const HDR_CSUM_OFF: Option<usize>;
    /// The DSR option as it sits right after a header without options or extension headers
    /// (`DSR_LEN` bytes), in words.
    type DsrOpt: Copy + AsRef<[u32]>;
    /// The header word `w` (at `DSR_WORD_OFF`) with the option after the header, and the
    /// option naming the frontend `addr`:`port_be`.
    fn dsr_build(w: u32, addr: &Self::Addr, port_be: u16) -> (u32, Self::DsrOpt);
    /// The frontend (address, port) the option `opt` names, if it is xlb's and the header
    /// word `w` says it follows the header.
    fn dsr_parse(w: u32, opt: &Self::DsrOpt) -> Option<(Self::Addr, u16)>;
    /// The interface the route toward `daddr` leaves by (`None`: no route).
    #[inline(always)]
    fn route_out(&self, ctx: &TcContext, daddr: &Self::Addr) -> Option<u32> {
        self.route(ctx, daddr, 0).map(|r| r.ifindex)
    }
    /// The IP packet's length, its header included (IPv4's total length; IPv6's 40 bytes
    /// and its payload length): what a route's MTU is checked against.
    fn ip_len(&self) -> u16;
    /// XDP: the way out of a packet `saddr → daddr` of `len` bytes, by its route (cached
    /// per CPU, per flow).
    #[inline(always)]
    fn hop(&self, ctx: &XdpContext, saddr: &Self::Addr, daddr: &Self::Addr, len: u16) -> Way {
        let here = Packet::ingress_ifindex(ctx);
        match fib::hop(ctx.raw(), here, self.proto(), saddr, daddr, len) {
            Some(hop) => Way::out(hop.out_ifindex, &hop.smac, &hop.dmac),
            None => Way::Tc,
        }
    }
    /// XDP: the way out of a packet `saddr → daddr` of `len` bytes where `daddr` is backend
    /// `backend` (index, generation): kept per backend where the node's routes of the
    /// family depend on the destination alone (`fib::backend_hop`: a new flow from a new
    /// client finds it), else per flow as [`Family::hop`].
    #[inline(always)]
    fn hop_to_backend(
        &self,
        ctx: &XdpContext,
        saddr: &Self::Addr,
        daddr: &Self::Addr,
        backend: (u32, u32),
        len: u16,
    ) -> Way {
        if !fib::by_destination::<Self::Addr>() {
            return self.hop(ctx, saddr, daddr, len);
        }
        let here = Packet::ingress_ifindex(ctx);
        match fib::backend_hop(ctx.raw(), here, self.proto(), saddr, daddr, backend, len) {
            Some(w) => Way::out(w.out_ifindex, &w.smac, &w.dmac),
            None => Way::Tc,
        }
    }
    /// The IP header of a packet without options or extension headers (`[u8; L4_OFF]`).
    type Hdr;
    /// Offset of the TTL (hop limit; IPv4's the first byte of a 16-bit word of the header).
    const TTL_OFF: usize;
    /// The L4 pseudo-header's one's-complement sum, unfolded: the addresses, the protocol
    /// and the L4 length (XDP's partial-checksum test, `xdp::checksum_partial`).
    #[inline(always)]
    fn pseudo_sum(&self) -> u32 {
        self.saddr().sum16() + self.daddr().sum16() + self.proto() as u32 + self.l4_len()
    }
}
