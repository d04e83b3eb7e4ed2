//! What the family-independent datapath steps (`conntrack.rs`'s flow logic) need of an
//! address family: its address ([`Addr`]: IPv4's `u32`, IPv6's `[u32; 4]`), the tuple
//! fields its keys, entries and parsed packets share by name ([`Ends`], [`Entry`]), and its
//! tables and scratch ([`Flow`], implemented by the parsed tuple: IPv4's `Tuple` in
//! `conntrack.rs`, IPv6's `Tuple6` in `v6/conntrack.rs`). Everything here is
//! `#[inline(always)]`: generic code compiles to what the family's own code was.

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{HashMap, LruHashMap},
};
use lb_common::{CT_MAP_CAPACITY, CtKey, CtKey6, CtValue, CtValue6};

use crate::{parse::Tuple, v6::parse::Tuple6};

/// An address: compared and copied word by word (an array comparison may become a `bcmp`
/// call, which BPF does not have; an array copy between two map values a `memmove`, whose
/// pointer subtraction the verifier refuses without CAP_PERFMON).
pub trait Addr: Copy {
    fn same(&self, other: &Self) -> bool;
    fn set(&mut self, from: &Self);
    /// One word of it (the address itself for IPv4, its words xor-ed for IPv6): what a
    /// check that needs only to tell entries apart keeps on the 512-byte stack.
    fn fold(&self) -> u32;
}

impl Addr for u32 {
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        *self == *other
    }
    #[inline(always)]
    fn fold(&self) -> u32 {
        *self
    }
    #[inline(always)]
    fn set(&mut self, from: &Self) {
        *self = *from;
    }
}

impl Addr for [u32; 4] {
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        eq6(self, other)
    }
    #[inline(always)]
    fn fold(&self) -> u32 {
        self[0] ^ self[1] ^ self[2] ^ self[3]
    }
    #[inline(always)]
    fn set(&mut self, from: &Self) {
        copy6(self, from)
    }
}

/// Whether two IPv6 addresses are equal, word by word.
#[inline(always)]
pub fn eq6(a: &[u32; 4], b: &[u32; 4]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) == 0
}

/// `*dst = *src` word by word, volatile (see [`Addr`]).
#[inline(always)]
pub fn copy6(dst: &mut [u32; 4], src: &[u32; 4]) {
    for i in 0..4 {
        // SAFETY: both indices are in bounds.
        unsafe { core::ptr::write_volatile(&mut dst[i], core::ptr::read_volatile(&src[i])) };
    }
}

/// The 4-tuple a conntrack key, a conntrack entry and a parsed packet share (fields
/// `saddr_be`, `daddr_be`, `sport_be`, `dport_be` in each).
pub trait Ends {
    type Addr: Addr;
    fn saddr(&self) -> &Self::Addr;
    fn daddr(&self) -> &Self::Addr;
    fn sport(&self) -> u16;
    fn dport(&self) -> u16;
    /// The four fields, writable.
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

/// What the flow steps read and write of a conntrack entry beyond its tuple: the fields
/// both layouts share.
pub trait Entry: Ends {
    fn flags(&self) -> u16;
    fn flags_mut(&mut self) -> &mut u16;
    fn last_seen(&mut self) -> &mut u64;
    fn last_seen_ns(&self) -> u64;
    fn created_ns(&self) -> u64;
    fn created(&mut self) -> &mut u64;
    fn mtu(&mut self) -> &mut u16;
    /// The backend's index and generation.
    fn backend(&self) -> (u32, u32);
    /// `*self = *src`, field by field (a struct copy between two map values compiles to a
    /// `memmove` whose overlap check subtracts pointers).
    fn copy_from(&mut self, src: &Self);
}

macro_rules! entry {
    ($t:ty) => {
        impl Entry for $t {
            #[inline(always)]
            fn flags(&self) -> u16 {
                self.flags
            }
            #[inline(always)]
            fn flags_mut(&mut self) -> &mut u16 {
                &mut self.flags
            }
            #[inline(always)]
            fn last_seen(&mut self) -> &mut u64 {
                &mut self.last_seen_ns
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
            fn created(&mut self) -> &mut u64 {
                &mut self.created_ns
            }
            #[inline(always)]
            fn mtu(&mut self) -> &mut u16 {
                &mut self.mtu
            }
            #[inline(always)]
            fn backend(&self) -> (u32, u32) {
                (self.backend_id, self.backend_gen)
            }
            #[inline(always)]
            fn copy_from(&mut self, src: &Self) {
                self.saddr_be.set(&src.saddr_be);
                self.daddr_be.set(&src.daddr_be);
                self.sport_be = src.sport_be;
                self.dport_be = src.dport_be;
                self.backend_id = src.backend_id;
                self.backend_gen = src.backend_gen;
                self.svc_id = src.svc_id;
                self.flags = src.flags;
                self.mtu = src.mtu;
                self._pad = 0;
                self.created_ns = src.created_ns;
                self.last_seen_ns = src.last_seen_ns;
            }
        }
    };
}
entry!(CtValue);
entry!(CtValue6);

/// A conntrack key's fields beyond its tuple.
pub trait Key: Ends {
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

/// The scratch fields a new flow's entries are built in (`FlowScratch`, `FlowScratch6`).
pub struct Parts<'a, K, V> {
    pub fwd: &'a mut V,
    pub reply: &'a mut V,
    pub fwd_key: &'a mut K,
    pub reply_key: &'a mut K,
}

/// A family, as its parsed packet's tuple knows it: what the packet says (protocol, TCP
/// flags, its tuple through [`Ends`]) and where its flows live.
pub trait Flow: Ends {
    type Key: Key<Addr = Self::Addr> + 'static;
    type Value: Entry<Addr = Self::Addr> + 'static;
    /// The family's flow scratch (a field of `work::WorkArea`).
    type Scratch: 'static;
    fn proto(&self) -> u8;
    fn tcp_flags(&self) -> u8;
    /// The LRU table and the assured table.
    fn ct() -> &'static CtTable<Self::Key, Self::Value>;
    fn cta() -> &'static CtaTable<Self::Key, Self::Value>;
    /// The conntrack fields of the scratch.
    fn parts(s: &mut Self::Scratch) -> Parts<'_, Self::Key, Self::Value>;
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
/// assured tables, its flow scratch type `$scratch`; the field names are both families'.
macro_rules! flow {
    ($tuple:ty, $key:ident, $value:ty, $scratch:ty, $ct:expr, $cta:expr) => {
        impl $crate::family::Flow for $tuple {
            type Key = $key;
            type Value = $value;
            type Scratch = $scratch;
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
                }
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
