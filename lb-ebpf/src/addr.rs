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
    /// The address at byte `at` of `b` (a quote), as it sits in the packet.
    fn read(b: &[u8], at: usize) -> Self;
    /// Writes it at byte `at` of `b`, byte by byte.
    fn write(&self, b: &mut [u8], at: usize);
    /// The one's-complement sum of its 16-bit words (network order), unfolded: its part of
    /// a pseudo-header's sum.
    fn sum16(&self) -> u32;
}

/// The one's-complement sum of a word's two 16-bit halves (network order).
#[inline(always)]
fn halves(w: u32) -> u32 {
    let w = u32::from_be(w);
    (w >> 16) + (w & 0xffff)
}

/// The word at byte `at` of `b`, as it sits in the packet.
#[inline(always)]
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Writes `w` at byte `at` of `b`, byte by byte.
#[inline(always)]
fn put(b: &mut [u8], at: usize, w: u32) {
    let x = w.to_ne_bytes();
    b[at] = x[0];
    b[at + 1] = x[1];
    b[at + 2] = x[2];
    b[at + 3] = x[3];
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
    #[inline(always)]
    fn read(b: &[u8], at: usize) -> Self {
        word(b, at)
    }
    #[inline(always)]
    fn write(&self, b: &mut [u8], at: usize) {
        put(b, at, *self)
    }
    #[inline(always)]
    fn sum16(&self) -> u32 {
        halves(*self)
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
    #[inline(always)]
    fn read(b: &[u8], at: usize) -> Self {
        [
            word(b, at),
            word(b, at + 4),
            word(b, at + 8),
            word(b, at + 12),
        ]
    }
    #[inline(always)]
    fn write(&self, b: &mut [u8], at: usize) {
        for (i, w) in self.iter().enumerate() {
            put(b, at + 4 * i, *w);
        }
    }
    #[inline(always)]
    fn sum16(&self) -> u32 {
        let mut sum = 0;
        for w in self {
            let b = w.to_ne_bytes();
            sum += (((b[0] as u32) << 8) | b[1] as u32) + (((b[2] as u32) << 8) | b[3] as u32);
        }
        sum
    }
}

/// Whether two IPv6 addresses are equal, word by word.
#[inline(always)]
pub fn eq6(a: &[u32; 4], b: &[u32; 4]) -> bool {
    (a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) == 0
}

/// `*dst = *src` word by word, volatile (see [`Addr`]).
pub use crate::maps::copy_words as copy6;
