//! SCTP's checksum (CRC32c, RFC 9260 appendix A) updated for a rewritten port without
//! reading the packet again: the datapath's way to keep an SCTP packet's checksum right
//! when NAT changes a port (an address is not covered by it).
//!
//! A CRC is linear: for two messages of one length, `crc(a) ^ crc(b)` is the CRC, with a
//! zero initial value and no final inversion, of `a ^ b`. A port rewrite changes only the
//! first four bytes of the SCTP packet (its ports), so the checksum changes by the raw CRC
//! of those four bytes' difference followed by the packet's remaining `len - 4` zero
//! bytes. Both halves are linear maps of the 32-bit CRC register (or of the four bytes'
//! difference), and a linear map of 32 bits is four byte-table lookups XORed: [`STEPS`]
//! holds the map from the difference to the register, and appending `v · 16^p` zero bytes
//! for each hex digit `v` at place `p` of the count. The whole update is five such steps
//! (twenty lookups), whatever the packet's length, with no branch and no bit mask.
//!
//! Why tables, and why each step is a call in the datapath (`nat::xlb_crc32c_step`):
//! - a carry-less multiplication compiles to `-(bit & 1) & C`, and Linux 6.18's verifier
//!   oopses on it (`maybe_fork_scalars`) when the loader lacks CAP_PERFMON, as the
//!   DaemonSet's CAP_BPF + CAP_NET_ADMIN does;
//! - without CAP_PERFMON the verifier also explores, at every table lookup (a pointer
//!   plus a variable offset), the speculative path with the offset masked, so twenty
//!   lookups in straight-line code are 2^20 paths at every call site. A global BPF
//!   function is verified once, on its own, with four lookups.
//!
//! The checksum field itself (bytes 8..12) is taken as zero by the CRC and is not part of
//! the difference.
//!
//! On the wire the checksum is the CRC's 32-bit value in little-endian byte order, so the
//! update is XORed into the field's bytes read as little-endian.

/// The Castagnoli polynomial, bit-reflected (as the register shifts right).
pub const POLY: u32 = 0x82f6_3b78;

/// The CRC register after one byte `i` from zero: the per-byte step's table.
pub const TABLE: [u32; 256] = table();

const fn table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

/// Hex digits of the tail length [`port_delta`] covers: 4 ([`MAX_TAIL`]).
pub const TAIL_DIGITS: usize = 4;

/// The largest packet (in bytes after the ports) [`port_delta`] covers: 65535.
pub const MAX_TAIL: u32 = (1 << (4 * TAIL_DIGITS)) - 1;

/// A linear map of 32 bits as four byte tables: entry `[j][b]` is the image of `b << 8j`,
/// and the images of a word's four bytes XOR to the word's.
pub type RegisterMap = [[u32; 256]; 4];

/// How many maps [`STEPS`] holds.
pub const STEP_COUNT: usize = 1 + 16 * TAIL_DIGITS;

/// The maps [`port_delta`] composes. `STEPS[0]`: four bytes (as a little-endian word) to
/// the CRC register after them, from zero. `STEPS[1 + 16p + v]`: the register after
/// appending `v · 16^p` zero bytes (`v = 0`: the identity). 260 KiB; in the datapath it is
/// the programs' read-only data (one copy per object).
pub static STEPS: [RegisterMap; STEP_COUNT] = steps();

const fn steps() -> [RegisterMap; STEP_COUNT] {
    let mut t = [[[0u32; 256]; 4]; STEP_COUNT];
    let mut j = 0;
    while j < 4 {
        let mut b = 0;
        while b < 256 {
            // Byte j is b and the others zero: the register after the four bytes.
            let mut reg = 0u32;
            let mut i = 0;
            while i < 4 {
                let byte = if i == j { b as u32 } else { 0 };
                reg = (reg >> 8) ^ TABLE[((reg ^ byte) & 0xff) as usize];
                i += 1;
            }
            t[0][j][b] = reg;
            b += 1;
        }
        j += 1;
    }
    let mut p = 0;
    while p < TAIL_DIGITS {
        let mut v = 0;
        while v < 16 {
            let at = 1 + 16 * p + v;
            let mut j = 0;
            while j < 4 {
                let mut b = 0;
                while b < 256 {
                    let reg = (b as u32) << (8 * j);
                    t[at][j][b] = if v == 0 {
                        reg
                    } else if v > 1 {
                        // v · 16^p: one more 16^p after (v - 1) · 16^p.
                        apply(&t[at - v + 1], t[at - 1][j][b])
                    } else if p == 0 {
                        (reg >> 8) ^ TABLE[(reg & 0xff) as usize]
                    } else {
                        // 16^p: 15 · 16^(p-1), then one more 16^(p-1).
                        apply(&t[at - 16], t[at - 2][j][b])
                    };
                    b += 1;
                }
                j += 1;
            }
            v += 1;
        }
        p += 1;
    }
    t
}

/// `map` applied to the word `reg`.
#[inline(always)]
pub const fn apply(map: &RegisterMap, reg: u32) -> u32 {
    map[0][(reg & 0xff) as usize]
        ^ map[1][((reg >> 8) & 0xff) as usize]
        ^ map[2][((reg >> 16) & 0xff) as usize]
        ^ map[3][(reg >> 24) as usize]
}

/// `STEPS[step]` applied to `reg`; 0 for a step out of range.
#[inline(always)]
pub fn step(step: u32, reg: u32) -> u32 {
    match STEPS.get(step as usize) {
        Some(map) => apply(map, reg),
        None => 0,
    }
}

/// What to XOR into the checksum (read as little-endian) of an SCTP packet of `len` bytes
/// (common header included, `4 ..= 65539`) whose first four bytes (source and destination
/// port, as on the wire) change from `old` to `new`. `tail` is `len - 4`, at most
/// [`MAX_TAIL`] (a larger one is masked: the caller bounds it).
#[inline(always)]
pub fn port_delta(old: [u8; 4], new: [u8; 4], tail: u32) -> u32 {
    port_delta_by(step, old, new, tail)
}

/// [`port_delta`] with each of its five steps made by `step` (as [`step`] does): the
/// datapath passes a BPF function, verified once.
#[inline(always)]
pub fn port_delta_by(
    mut step: impl FnMut(u32, u32) -> u32,
    old: [u8; 4],
    new: [u8; 4],
    tail: u32,
) -> u32 {
    let diff = u32::from_le_bytes(old) ^ u32::from_le_bytes(new);
    let mut reg = step(0, diff);
    let tail = tail & MAX_TAIL;
    let mut p = 0;
    while p < TAIL_DIGITS as u32 {
        reg = step(1 + 16 * p + ((tail >> (4 * p)) & 0xf), reg);
        p += 1;
    }
    reg
}

/// CRC32c of `data` (initial value all ones, final inversion): for tests and tools, one
/// table step per byte.
pub fn checksum(data: &[u8]) -> u32 {
    let mut reg = !0u32;
    for b in data {
        reg = (reg >> 8) ^ TABLE[((reg ^ *b as u32) & 0xff) as usize];
    }
    !reg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_value_of_the_standard() {
        // RFC 3720 B.4 and every CRC-32C catalogue: "123456789" → 0xE3069283.
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn a_port_rewrite_updates_the_checksum_as_a_recomputation_would() {
        let mut seed = 0x1234_5678u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for len in [12usize, 13, 16, 64, 255, 256, 257, 1500, 4099, 9000, 65539] {
            let mut pkt: [u8; 65539] = [0; 65539];
            let pkt = &mut pkt[..len];
            for b in pkt.iter_mut() {
                *b = next() as u8;
            }
            pkt[8..12].fill(0);
            let before = checksum(pkt);
            let old = [pkt[0], pkt[1], pkt[2], pkt[3]];
            let new = (next()).to_be_bytes();
            pkt[..4].copy_from_slice(&new);
            let after = checksum(pkt);
            assert_eq!(
                before ^ port_delta(old, new, len as u32 - 4),
                after,
                "length {len}"
            );
        }
    }
}
