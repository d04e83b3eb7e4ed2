//! The programs' opt-in debug log (aya-log): one line per decision, read into the agent's
//! log with `xlb agent --bpf-log debug`. Off (the default), a program pays one lookup of the
//! config array (inlined by the verifier) and a branch; the logging itself is out of line,
//! in its own stack frame, so it adds nothing to the main paths' 512 bytes.

use aya_ebpf::programs::{TcContext, XdpContext};
use aya_log_ebpf::debug;
use lb_common::CFG_F_BPF_LOG;

use crate::{maps::XLB_CFG_V2, packet, parse::ETH_HLEN};

/// The agent asked for the debug log.
#[inline(always)]
pub fn on() -> bool {
    XLB_CFG_V2
        .get(0)
        .is_some_and(|c| c.flags & CFG_F_BPF_LOG != 0)
}

/// An IPv4 header's addresses and the ports after it (0 when absent), host order.
#[derive(Clone, Copy, Default)]
struct Seen {
    proto: u8,
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
}

/// What a frame of `len` bytes at `load` holds as it leaves the program (rewritten or not).
#[inline(always)]
fn seen(load: impl Fn(usize) -> Option<u32>) -> Seen {
    let ip = ETH_HLEN;
    let (Some(w0), Some(w2), Some(src), Some(dst)) =
        (load(ip), load(ip + 8), load(ip + 12), load(ip + 16))
    else {
        return Seen::default();
    };
    let w0 = u32::from_be(w0);
    if w0 >> 28 != 4 {
        return Seen::default();
    }
    let ihl = ((w0 >> 24) & 0xf) as usize * 4;
    let proto = (u32::from_be(w2) >> 16) as u8;
    let ports = if proto == 6 || proto == 17 {
        load(ip + 20).filter(|_| ihl == 20).map_or(0, u32::from_be)
    } else {
        0
    };
    Seen {
        proto,
        src: u32::from_be(src),
        dst: u32::from_be(dst),
        sport: (ports >> 16) as u16,
        dport: ports as u16,
    }
}

/// tc's decision: its action, the reason counted, the packet as it leaves. The packet is
/// read here (the verifier wants packet pointers in the frame that checked them), the line
/// written out of line.
#[inline(always)]
pub fn tc(ctx: &TcContext, action: i32, reason: u32) {
    let s = seen(|off| ctx.load::<u32>(off).ok());
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
        s.sport,
        s.dst,
        s.dport
    );
}

/// XDP's decision, likewise.
#[inline(always)]
pub fn xdp(ctx: &XdpContext, action: u32, reason: u32) {
    let s = seen(|off| {
        // SAFETY: `at` checked the bounds against data_end.
        packet::at::<_, u32>(ctx, off).map(|p| unsafe { core::ptr::read_unaligned(p) })
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
        s.sport,
        s.dst,
        s.dport
    );
}
