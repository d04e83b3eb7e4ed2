//! A map value other CPUs write, or a delete frees (conntrack entries, affinity entries):
//! held as a [`Shared`], a pointer, never as a Rust reference.
//!
//! The rule, for every such value:
//! - it is looked up with `get_ptr_mut` straight into a `Shared` (never `get`, which hands
//!   out a `&V` for as long as the caller likes, and never `&*` / `&mut *` of the pointer);
//! - a field written in place (a conntrack entry's `flags`, `mtu` and `last_seen_ns`, an
//!   affinity entry's `last_seen_ns`) is read and written through the pointer, volatile: a
//!   copy in a local, never a reference, whatever another CPU writes meanwhile; a conntrack
//!   entry's `pending` counts are read so and written only by atomic adds;
//! - the other fields are never written in place (a value is replaced whole, by an insert):
//!   they are read through the pointer too, and a tuple field may be lent (`&`) for as long as
//!   the `Shared` is borrowed;
//! - a `Shared` is neither `Copy` nor `Clone`, and whatever deletes its entry takes it by
//!   value (`conntrack::start_over`) or tells its caller to drop it (`conntrack::promote`):
//!   nothing reads an entry after its delete.
//!
//! A new flow's entries built in the per-CPU work area are handed to the same steps (the
//! rewrite, `nat.rs`) as a `Shared` of the scratch ([`Shared::local`]), borrowed from it.
//! `tests/tests/offline/source_rules.rs` checks the first point.

use core::{marker::PhantomData, ptr::NonNull};

/// A map value (or a scratch value, [`Shared::local`]) read and written through its pointer.
pub struct Shared<'a, V> {
    p: NonNull<V>,
    _life: PhantomData<&'a mut V>,
}

impl<V> Shared<'static, V> {
    /// The value a map's `get_ptr_mut` returned (`None`: not found).
    #[inline(always)]
    pub fn of(p: Option<*mut V>) -> Option<Self> {
        p.and_then(NonNull::new).map(|p| Self {
            p,
            _life: PhantomData,
        })
    }
}

impl<'a, V> Shared<'a, V> {
    /// A value of this run's own (the work area's), seen as a shared one for as long as it
    /// is borrowed.
    #[inline(always)]
    pub fn local(v: &'a mut V) -> Self {
        Self {
            p: NonNull::from(v),
            _life: PhantomData,
        }
    }

    /// The same value, lent (passed in one register where a `&Shared` would be a pointer
    /// to a stack slot): while it lives, the entry cannot be handed to a delete.
    #[inline(always)]
    pub fn lend(&self) -> Shared<'_, V> {
        Shared {
            p: self.p,
            _life: PhantomData,
        }
    }

    /// Lets the value go: what may delete it comes next (the handle is gone, so nothing
    /// reads it afterwards).
    #[inline(always)]
    pub fn release(self) {}

    /// The value's address: read and written through with `core::ptr` (the field macros
    /// below), never turned into a reference to the whole value.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut V {
        self.p.as_ptr()
    }
}

/// Field `$f` of the value `$s` (a [`Shared`]) points to, copied out (a field never written
/// in place).
macro_rules! get {
    ($s:expr, $f:ident) => {{
        let p = $s.as_ptr();
        // SAFETY: a Shared points to a live value, and this field is never written in place.
        unsafe { ::core::ptr::addr_of!((*p).$f).read() }
    }};
}

/// Field `$f` of the value `$s` points to, copied out volatile (a field written in place,
/// maybe by another CPU at the same time).
macro_rules! load {
    ($s:expr, $f:ident) => {{
        let p = $s.as_ptr();
        // SAFETY: a Shared points to a live value; the read is one volatile load.
        unsafe { ::core::ptr::addr_of!((*p).$f).read_volatile() }
    }};
}

/// Writes `$v` to field `$f` of the value `$s` points to, volatile.
macro_rules! store {
    ($s:expr, $f:ident, $v:expr) => {{
        let v = $v;
        let p = $s.as_ptr();
        // SAFETY: a Shared points to a live value; the write is one volatile store.
        unsafe { ::core::ptr::addr_of_mut!((*p).$f).write_volatile(v) }
    }};
}

pub(crate) use {get, load, store};
