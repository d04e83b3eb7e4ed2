//! SCTP's checksum (CRC32c, RFC 9260 appendix A) updated for a rewritten port without
//! reading the packet again: the datapath's way to keep an SCTP packet's checksum right
//! when NAT changes a port (an address is not covered by it).
//!
//! A CRC is linear: for two messages of one length, `crc(a) ^ crc(b)` is the CRC, with a
//! zero initial value and no final inversion, of `a ^ b`. A port rewrite changes only the
//! first four bytes of the SCTP packet (its ports), so the checksum changes by the raw CRC
//! of those four bytes' difference followed by the packet's remaining `len - 4` zero
//! bytes, and appending `n` zero bytes multiplies the CRC register by `x^(8n)` modulo the
//! polynomial. [`X8N_LO`] and [`X8N_HI`] hold those powers for `n`'s low and high byte:
//! the whole update is four table steps and two carry-less multiplications (32 steps
//! each), whatever the packet's length. The checksum field itself (bytes 8..12) is taken
//! as zero by the CRC and is not part of the difference.
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

/// `a(x) · b(x) mod P(x)`, both reflected (bit 31 is `x^0`).
#[inline(always)]
pub const fn mul(a: u32, b: u32) -> u32 {
    let mut product = 0u32;
    let mut b = b;
    let mut bit = 0;
    while bit < 32 {
        if a & (0x8000_0000 >> bit) != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit += 1;
    }
    product
}

/// `x^(8n) mod P` for `n` in `0..256`: appending `n` zero bytes to a message.
pub const X8N_LO: [u32; 256] = powers(1);
/// `x^(8·256·n) mod P` for `n` in `0..256`: appending `256·n` zero bytes.
pub const X8N_HI: [u32; 256] = powers(256);

/// `x^(8·step·n)` for `n` in `0..256`, each from the one before.
const fn powers(step: u32) -> [u32; 256] {
    // x^8 (one zero byte), then x^(8·step) by squaring and multiplying.
    let x8 = 1u32 << (31 - 8);
    let mut unit = 0x8000_0000u32; // x^0
    let mut k = 0;
    while k < step {
        unit = mul(unit, x8);
        k += 1;
    }
    let mut p = [0u32; 256];
    p[0] = 0x8000_0000;
    let mut n = 1;
    while n < 256 {
        p[n] = mul(p[n - 1], unit);
        n += 1;
    }
    p
}

/// The largest packet (in bytes after the ports) [`port_delta`] covers: 65535.
pub const MAX_TAIL: u32 = 0xffff;

/// What to XOR into the checksum (read as little-endian) of an SCTP packet of `len` bytes
/// (common header included, `4 ..= 65539`) whose first four bytes (source and destination
/// port, as on the wire) change from `old` to `new`. `tail` is `len - 4`, at most
/// [`MAX_TAIL`] (a larger one is masked: the caller bounds it).
#[inline(always)]
pub fn port_delta(old: [u8; 4], new: [u8; 4], tail: u32) -> u32 {
    let mut reg = 0u32;
    let mut i = 0;
    while i < 4 {
        reg = (reg >> 8) ^ TABLE[((reg ^ (old[i] ^ new[i]) as u32) & 0xff) as usize];
        i += 1;
    }
    let tail = tail & MAX_TAIL;
    mul(
        mul(reg, X8N_LO[(tail & 0xff) as usize]),
        X8N_HI[(tail >> 8) as usize],
    )
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
