//! The per-CPU work area a program run builds its big values in (the stack is only 512
//! bytes): a new flow's conntrack entries and keys, an ICMP error's quote, the parsed IPv6
//! packet.
//!
//! One slot per CPU, turned into a `&mut` once per program run, at the program's entry
//! ([`acquire`]), and handed down from there as a parameter (or as disjoint borrows of its
//! fields). So no two live `&mut` to the slot ever exist: a step that needs it takes it from
//! its caller, never from the map. The one other place that dereferences a pointer to it is
//! the `bpf_loop` callback of the SNAT port search (`conntrack::try_port`), which reborrows
//! the scratch its parent lent it for the loop.

use aya_ebpf::{btf_maps::PerCpuArray, macros::btf_map};
use lb_common::R_CT_FULL;

use crate::{
    maps::FlowScratch,
    reason::Reason,
    v6::{maps::FlowScratch6, parse::Tuple6},
};

/// What one program run works in: each family's part.
#[repr(C)]
pub struct WorkArea {
    pub v4: FlowScratch,
    pub v6: Work6,
}

/// The IPv6 path's part: the packet as parsed (the IPv6 steps pass this one pointer down and
/// split it into its two fields where they need both).
#[repr(C)]
pub struct Work6 {
    pub pkt: Tuple6,
    pub flow: FlowScratch6,
}

const _: () = assert!(core::mem::size_of::<FlowScratch>() == 224);
const _: () = assert!(core::mem::size_of::<FlowScratch6>() == 360);
const _: () = assert!(core::mem::size_of::<WorkArea>() == 640);

/// A family's part of the work area, not yet taken: a step calls it once, when it knows the
/// packet may be a service's (the entry's closure over [`acquire`], or one lending a part
/// the entry already holds), so a packet that is no service's never touches the slot.
pub trait Work<'a, S: 'a>: FnOnce() -> Result<&'a mut S, Reason> {}

impl<'a, S: 'a, W: FnOnce() -> Result<&'a mut S, Reason>> Work<'a, S> for W {}

/// The work area, per CPU. Written and read here only, within one program run: nothing is
/// carried from one run to the next. index 0 → `WorkArea` (640 B). 1 entry, not pinned.
#[btf_map]
static XLB_WORK: PerCpuArray<WorkArea, 1> = PerCpuArray::new();

/// This CPU's work area, for the rest of the program run (`R_CT_FULL` if the slot cannot be
/// had, which a one-entry array's index 0 never is).
///
/// # Safety
/// Called at most once per program run, at its entry; everything below gets the work area
/// (or a field of it) from there. The programs that use it (tc and XDP, run with bottom
/// halves off) do not nest on a CPU, so the slot is this run's alone until it returns.
#[inline(always)]
pub unsafe fn acquire<'a>() -> Result<&'a mut WorkArea, Reason> {
    let p = XLB_WORK.get_ptr_mut(0).ok_or(Reason(R_CT_FULL))?;
    // SAFETY: this CPU's slot, unaliased for the run (the caller's promise above).
    Ok(unsafe { &mut *p })
}
