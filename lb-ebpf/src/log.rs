//! The programs' opt-in debug log (aya-log): one line per decision, read into the agent's
//! log with `xlb agent --bpf-log debug`. Off (the default), a program pays one lookup of the
//! config array (inlined by the verifier) and a branch; the logging itself is out of line,
//! in its own stack frame, so it adds nothing to the main paths' 512 bytes.

use aya_ebpf::programs::{TcContext, XdpContext};
use aya_log_ebpf::debug;
use lb_common::CFG_F_BPF_LOG;

use crate::{maps::XLB_CFG_V3, packet, parse::ETH_HLEN};

/// The agent asked for the debug log.
#[inline(always)]
pub fn on() -> bool {
    XLB_CFG_V3
        .get(0)
        .is_some_and(|c| c.flags & CFG_F_BPF_LOG != 0)
}

/// An IPv4 header's addresses and the ports after it (0 when absent), host order. No
/// implicit padding: the line's frame reads it by words, and without CAP_PERFMON the
/// verifier refuses a read of stack bytes never written.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Seen {
    src: u32,
    dst: u32,
    /// Source port << 16 | destination port.
    ports: u32,
    proto: u32,
}

/// What a frame holds as it leaves the program (rewritten or not). `load(off)` is the
/// 32-bit word at `off` (network order) with bit 32 set, or 0 when it cannot be read: a
/// plain integer, not an `Option`, whose unwritten half the verifier would see read from the
/// stack (refused without CAP_PERFMON).
#[inline(always)]
fn seen(load: impl Fn(usize) -> u64) -> Seen {
    const OK: u64 = 1 << 32;
    let ip = ETH_HLEN;
    let (w0, w2, src, dst) = (load(ip), load(ip + 8), load(ip + 12), load(ip + 16));
    if w0 & w2 & src & dst & OK == 0 {
        return Seen::default();
    }
    let w0 = u32::from_be(w0 as u32);
    if w0 >> 28 != 4 {
        return Seen::default();
    }
    let ihl = ((w0 >> 24) & 0xf) as usize * 4;
    let proto = (u32::from_be(w2 as u32) >> 16) as u8;
    let ports = if (proto == 6 || proto == 17) && ihl == 20 {
        let p = load(ip + 20);
        if p & OK != 0 {
            u32::from_be(p as u32)
        } else {
            0
        }
    } else {
        0
    };
    Seen {
        src: u32::from_be(src as u32),
        dst: u32::from_be(dst as u32),
        ports,
        proto: proto as u32,
    }
}

/// tc's decision: its action, the reason counted, the packet as it leaves. Out of line, so
/// that what it reads stays off the program's main frame (the packet is read here, where its
/// pointers are checked; the line is written in a frame of its own).
#[inline(never)]
pub fn tc(ctx: &TcContext, action: i32, reason: u32) {
    let s = seen(|off| match ctx.load::<u32>(off) {
        Ok(v) => v as u64 | 1 << 32,
        Err(_) => 0,
    });
    tc_line(ctx, action, reason, &s);
}

#[inline(never)]
fn tc_line(ctx: &TcContext, action: i32, reason: u32, s: &Seen) {
    debug!(
        ctx,
        "tc reason={} action={} proto={} {:i}:{} -> {:i}:{}",
        reason,
        action,
        s.proto,
        s.src,
        (s.ports >> 16) as u16,
        s.dst,
        s.ports as u16
    );
}

/// XDP's decision, likewise.
#[inline(never)]
pub fn xdp(ctx: &XdpContext, action: u32, reason: u32) {
    let s = seen(|off| match packet::at::<_, u32>(ctx, off) {
        // SAFETY: `at` checked the bounds against data_end.
        Some(p) => (unsafe { core::ptr::read_unaligned(p) }) as u64 | 1 << 32,
        None => 0,
    });
    xdp_line(ctx, action, reason, &s);
}

#[inline(never)]
fn xdp_line(ctx: &XdpContext, action: u32, reason: u32, s: &Seen) {
    debug!(
        ctx,
        "xdp reason={} action={} proto={} {:i}:{} -> {:i}:{}",
        reason,
        action,
        s.proto,
        s.src,
        (s.ports >> 16) as u16,
        s.dst,
        s.ports as u16
    );
}
