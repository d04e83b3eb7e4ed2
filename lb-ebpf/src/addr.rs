//! An address of either family (IPv4's `u32`, IPv6's `[u32; 4]`), as the family-independent
//! steps compare and copy it ([`Addr`]); its own module so that the leaves and the route
//! lookups (`fib.rs`) can use it without importing `family.rs`.

/// An address: compared and copied word by word (an array comparison may become a `bcmp`
/// call, which BPF does not have; an array copy between two map values a `memmove`, whose
/// pointer subtraction the verifier refuses without CAP_PERFMON).
pub trait Addr: Copy {
    fn same(&self, other: &Self) -> bool;
    fn set(&mut self, from: &Self);
    /// One word of it (the address itself for IPv4, its words xor-ed for IPv6): what a
    /// check that needs only to tell entries apart keeps on the 512-byte stack.
    fn fold(&self) -> u32;
    /// Unset (all zero).
    fn is_zero(&self) -> bool;
    /// Its four words (IPv4's in word 0, the rest zero), as `lb_common::flow_hash` takes
    /// an address.
    fn words(&self) -> [u32; 4];
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
    #[inline(always)]
    fn is_zero(&self) -> bool {
        *self == 0
    }
    #[inline(always)]
    fn words(&self) -> [u32; 4] {
        [*self, 0, 0, 0]
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
    #[inline(always)]
    fn is_zero(&self) -> bool {
        self[0] | self[1] | self[2] | self[3] == 0
    }
    #[inline(always)]
    fn words(&self) -> [u32; 4] {
        *self
    }
}

/// Whether two IPv6 addresses are equal, word by word.
#[inline(always)]
pub fn eq6(a: &[u32; 4], b: &[u32; 4]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) == 0
}

/// `*dst = *src` word by word, volatile (see [`Addr`]).
pub use crate::maps::copy_words as copy6;
