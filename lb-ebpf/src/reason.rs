//! Reason codes and the per-CPU counters they bump.

use aya_ebpf::{btf_maps::Array, helpers::bpf_get_smp_processor_id};
use lb_common::Counter;

use crate::maps::{XLB_BE_STRIDE, XLB_BESTAT_V3, XLB_STATS_V8, XLB_SVC_STRIDE, XLB_SVCSTAT_V3};

/// A reason code from `lb_common::counters`.
#[derive(Clone, Copy)]
pub struct Reason(pub u32);

impl Reason {
    /// Adds one packet of `len` bytes to this reason's counter on the current CPU.
    #[inline(always)]
    pub fn count(self, len: u32) {
        if let Some(c) = XLB_STATS_V8.get_ptr_mut(self.0) {
            // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
            unsafe {
                (*c).packets += 1;
                (*c).bytes += len as u64;
            }
        }
    }
}

/// Adds one packet of `len` bytes to the counters of service index `svc_id` and of the
/// backend index `backend_id` it was forwarded to (or came from), in the current CPU's row
/// of each: a computed address apiece, no hash lookup and no per-CPU pointer table.
#[inline(always)]
pub fn count_service(svc_id: u32, backend_id: u32, len: u32) {
    add_service(svc_id, backend_id, 1, len);
}

/// Adds `packets` packets of `bytes` bytes in all to the counters of service index `svc_id`
/// and backend index `backend_id`, in the current CPU's rows (as [`count_service`]; a
/// conntrack entry's pending counts, `conntrack::count`).
#[inline(always)]
pub fn add_service(svc_id: u32, backend_id: u32, packets: u32, bytes: u32) {
    // SAFETY: a helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    add(
        &XLB_BESTAT_V3,
        XLB_BE_STRIDE.load(),
        cpu,
        backend_id,
        packets,
        bytes,
    );
    add(
        &XLB_SVCSTAT_V3,
        XLB_SVC_STRIDE.load(),
        cpu,
        svc_id,
        packets,
        bytes,
    );
}

/// Adds `packets` of `bytes` to index `id` of CPU `cpu`'s row (`stride` indices) of `rows`.
#[inline(always)]
fn add<const N: usize>(
    rows: &Array<Counter, N>,
    stride: u32,
    cpu: u32,
    id: u32,
    packets: u32,
    bytes: u32,
) {
    if id >= stride {
        return;
    }
    if let Some(c) = rows.get_ptr_mut(cpu.wrapping_mul(stride).wrapping_add(id)) {
        // SAFETY: this CPU's row, which only this CPU writes while the program runs.
        unsafe {
            (*c).packets += packets as u64;
            (*c).bytes += bytes as u64;
        }
    }
}

/// A program's verdict type: tc's `i32` actions, XDP's `u32` ones.
pub trait Action: Copy {
    fn to_bits(self) -> u32;
    fn from_bits(bits: u32) -> Self;
}

impl Action for i32 {
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self as u32
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bits as i32
    }
}

impl Action for u32 {
    #[inline(always)]
    fn to_bits(self) -> u32 {
        self
    }
    #[inline(always)]
    fn from_bits(bits: u32) -> Self {
        bits
    }
}

/// A program's outcome: `Ok((action, reason))`, the packet goes on (possibly rewritten) or is
/// sent back as an answer; `Err(reason)`, it is dropped. Either way `reason` is counted.
pub type Outcome<A> = Result<(A, Reason), Reason>;

/// An outcome carried out of an `#[inline(never)]` path in one register: each out-of-line
/// path has its own stack frame, so the big rare ones do not add up in the main one (512
/// bytes in all), and a register is all a frame returns. Only built and read here.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Carried(u64);

/// What an out-of-line step leaves to its caller.
pub enum Then<A> {
    /// Its outcome.
    Done(Outcome<A>),
    /// No verdict yet: the step found no flow (or chose a backend, or recorded the flow) and
    /// leaves the packet to the next step; the reason is the one a new flow of it is
    /// counted under.
    Next(Reason),
    /// Refuse the flow (no endpoints): the caller builds the answer in a frame of its own.
    Refuse,
    /// Answer fragmentation needed with this MTU, likewise.
    FragNeeded(u16),
}

const DROPPED: u64 = 1 << 63;
const REFUSE: u64 = 1 << 62;
const FRAG_NEEDED: u64 = 1 << 61;
const NEXT: u64 = 1 << 60;
const ACTION_MASK: u64 = 0x1fff_ffff;

impl Carried {
    #[inline(always)]
    pub fn done<A: Action>(o: Outcome<A>) -> Self {
        Self(match o {
            Ok((action, reason)) => {
                ((action.to_bits() as u64 & ACTION_MASK) << 32) | reason.0 as u64
            }
            Err(reason) => DROPPED | reason.0 as u64,
        })
    }

    #[inline(always)]
    pub fn then<A: Action>(t: Result<Then<A>, Reason>) -> Self {
        match t {
            Ok(Then::Done(o)) => Self::done(o),
            Ok(Then::Refuse) => Self(REFUSE),
            Ok(Then::FragNeeded(mtu)) => Self(FRAG_NEEDED | mtu as u64),
            Ok(Then::Next(reason)) => Self(NEXT | reason.0 as u64),
            Err(r) => Self::done::<A>(Err(r)),
        }
    }

    /// The outcome (for paths that carry only an outcome).
    #[inline(always)]
    pub fn outcome<A: Action>(self) -> Outcome<A> {
        let reason = Reason(self.0 as u32);
        if self.0 & DROPPED != 0 {
            Err(reason)
        } else {
            Ok((A::from_bits(((self.0 >> 32) & ACTION_MASK) as u32), reason))
        }
    }

    /// What the caller is to do next.
    #[inline(always)]
    pub fn next<A: Action>(self) -> Then<A> {
        if self.0 & DROPPED == 0 && self.0 & REFUSE != 0 {
            Then::Refuse
        } else if self.0 & DROPPED == 0 && self.0 & FRAG_NEEDED != 0 {
            Then::FragNeeded(self.0 as u16)
        } else if self.0 & DROPPED == 0 && self.0 & NEXT != 0 {
            Then::Next(Reason(self.0 as u32))
        } else {
            Then::Done(self.outcome())
        }
    }
}
