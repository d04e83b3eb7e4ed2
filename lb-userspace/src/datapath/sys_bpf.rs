//! The raw `bpf(2)` commands xlb issues itself, for what aya 0.14 does not offer (batch map
//! operations, link detach, the link id list): one syscall each, behind the [`Bpf`] trait,
//! so that the code around them (chunking, partial failures, the walk's end) is tested
//! against [`fake`] (aya's `sys/` and `sys/fake.rs` are the model). [`Kernel`] is the real
//! one and the only place in xlb that calls `bpf(2)` directly.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

#[cfg(test)]
pub mod fake;

/// One `BPF_MAP_*_BATCH` call's buffers: `count` keys and values, back to back.
pub struct Batch<'a> {
    pub keys: &'a [u8],
    pub values: &'a [u8],
}

/// One `BPF_MAP_LOOKUP_BATCH` call: where it starts (`None`: the map's start) and where the
/// kernel writes the next start, the keys and values, and at most `count` entries.
pub struct Lookup<'a> {
    pub at: Option<&'a [u8]>,
    pub next: &'a mut [u8],
    pub keys: &'a mut [u8],
    pub values: &'a mut [u8],
    pub count: u32,
}

/// The `bpf(2)` commands xlb issues itself, one syscall each.
pub trait Bpf {
    /// `BPF_MAP_UPDATE_BATCH` of `count` entries; `Err((written, error))`: the kernel
    /// wrote the first `written`, then failed.
    fn update_batch(
        &self,
        map: BorrowedFd<'_>,
        batch: Batch<'_>,
        count: u32,
    ) -> Result<(), (u32, io::Error)>;

    /// `BPF_MAP_LOOKUP_BATCH`: how many entries it read (`Err` with `ENOENT` and the count
    /// of the last ones: the end of the map).
    fn lookup_batch(&self, map: BorrowedFd<'_>, lookup: Lookup<'_>) -> (u32, io::Result<()>);

    /// `BPF_OBJ_GET`: the object pinned at `path`.
    fn obj_get(&self, path: &Path) -> io::Result<OwnedFd>;

    /// `BPF_LINK_DETACH` of the link `link`.
    fn link_detach(&self, link: BorrowedFd<'_>) -> io::Result<()>;

    /// `BPF_LINK_GET_NEXT_ID`: the id of the kernel's next link after `start`.
    fn link_next_id(&self, start: u32) -> io::Result<u32>;
}

/// The kernel's `bpf(2)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Kernel;

/// `enum bpf_cmd`'s values.
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;
const BPF_LINK_DETACH: libc::c_long = 34;

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `union bpf_attr`'s `BPF_OBJ_*` members.
#[repr(C)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    /// Zero: the kernel refuses a nonzero byte past the fields it knows.
    _pad: u32,
}

/// `union bpf_attr`'s `link_detach` member.
#[repr(C)]
struct DetachAttr {
    link_fd: u32,
}

/// `union bpf_attr`'s `start_id`/`next_id` members.
#[repr(C)]
struct NextIdAttr {
    start_id: u32,
    next_id: u32,
    open_flags: u32,
}

impl Bpf for Kernel {
    fn update_batch(
        &self,
        map: BorrowedFd<'_>,
        batch: Batch<'_>,
        count: u32,
    ) -> Result<(), (u32, io::Error)> {
        let mut attr = BatchAttr {
            keys: batch.keys.as_ptr() as u64,
            values: batch.values.as_ptr() as u64,
            count,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at `count` keys and values (the caller's slices hold
        // them) that outlive the call; the kernel reads them and writes back only `count`.
        match unsafe { bpf(BPF_MAP_UPDATE_BATCH, &mut attr) } {
            Ok(_) => Ok(()),
            Err(e) => Err((attr.count.min(count), e)),
        }
    }

    fn lookup_batch(&self, map: BorrowedFd<'_>, l: Lookup<'_>) -> (u32, io::Result<()>) {
        let mut attr = BatchAttr {
            in_batch: l.at.map_or(0, |a| a.as_ptr() as u64),
            out_batch: l.next.as_mut_ptr() as u64,
            keys: l.keys.as_mut_ptr() as u64,
            values: l.values.as_mut_ptr() as u64,
            count: l.count,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at buffers for `count` keys and values and two position
        // tokens of at least the key's size (the caller's slices), all outliving the
        // call; the kernel writes at most `count` entries and one token.
        let r = unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) };
        (attr.count.min(l.count), r.map(|_| ()))
    }

    fn obj_get(&self, path: &Path) -> io::Result<OwnedFd> {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut attr = ObjAttr {
            pathname: name.as_ptr() as u64,
            bpf_fd: 0,
            file_flags: 0,
            path_fd: 0,
            _pad: 0,
        };
        // SAFETY: the name `attr` points at outlives the call; the kernel only reads it and
        // returns a new file descriptor.
        let r = unsafe { bpf(BPF_OBJ_GET, &mut attr) }
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
    }

    fn link_detach(&self, link: BorrowedFd<'_>) -> io::Result<()> {
        let mut attr = DetachAttr {
            link_fd: link.as_raw_fd() as u32,
        };
        // SAFETY: `attr` holds no pointer.
        unsafe { bpf(BPF_LINK_DETACH, &mut attr) }.map(|_| ())
    }

    fn link_next_id(&self, start: u32) -> io::Result<u32> {
        let mut attr = NextIdAttr {
            start_id: start,
            next_id: 0,
            open_flags: 0,
        };
        // SAFETY: `attr` holds no pointer; the kernel writes `next_id`.
        unsafe { bpf(BPF_LINK_GET_NEXT_ID, &mut attr) }?;
        Ok(attr.next_id)
    }
}

/// `bpf(cmd, attr, sizeof attr)`: the kernel's answer (a new descriptor for some commands),
/// or the error it set.
///
/// `A` must be `#[repr(C)]` with every byte defined (explicit padding fields): the kernel
/// refuses a nonzero byte past the fields it knows for the command.
///
/// # Safety
/// Every pointer inside `attr` must be valid for what `cmd` does with it (read or written,
/// for the sizes `attr` gives) for the duration of the call.
unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, exclusively borrowed value of the size passed; the kernel
    // reads it and writes back only within it; the pointers inside it are the caller's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A,
            std::mem::size_of::<A>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}
