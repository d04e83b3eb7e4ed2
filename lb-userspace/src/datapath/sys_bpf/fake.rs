//! A fake [`Bpf`]: one hash map of byte keys and values in memory, with the kernel's answers
//! to the batch commands (a full map refuses a new key with `E2BIG` after writing those
//! before it; a walk ends with `ENOENT`), a kernel without batch commands (`EINVAL`), and a
//! failure injected at a position of a walk. No link commands.

use std::{
    cell::{Cell, RefCell},
    collections::BTreeMap,
    io,
    os::fd::{BorrowedFd, OwnedFd},
    path::Path,
};

use super::{Batch, Bpf, Lookup};

/// The map behind every descriptor the fake is handed.
#[derive(Debug)]
pub struct FakeMap {
    key_size: usize,
    value_size: usize,
    capacity: usize,
    entries: RefCell<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// The kernel has the batch commands.
    pub batches: bool,
    /// A walk fails (`EIO`) when it reaches this many entries.
    pub fail_lookup_at: Option<usize>,
    /// Syscalls made.
    pub calls: Cell<usize>,
}

impl FakeMap {
    pub fn new(key_size: usize, value_size: usize, capacity: usize) -> Self {
        Self {
            key_size,
            value_size,
            capacity,
            entries: RefCell::default(),
            batches: true,
            fail_lookup_at: None,
            calls: Cell::new(0),
        }
    }

    /// The entries, in key order.
    pub fn entries(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.entries.borrow().clone()
    }

    fn call(&self) -> Result<(), io::Error> {
        self.calls.set(self.calls.get() + 1);
        match self.batches {
            true => Ok(()),
            false => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

impl Bpf for FakeMap {
    fn update_batch(
        &self,
        _map: BorrowedFd<'_>,
        batch: Batch<'_>,
        count: u32,
    ) -> Result<(), (u32, io::Error)> {
        self.call().map_err(|e| (0, e))?;
        let (ks, vs) = (self.key_size, self.value_size);
        let mut entries = self.entries.borrow_mut();
        for i in 0..count as usize {
            let key = batch.keys[i * ks..(i + 1) * ks].to_vec();
            if !entries.contains_key(&key) && entries.len() >= self.capacity {
                return Err((i as u32, io::Error::from_raw_os_error(libc::E2BIG)));
            }
            entries.insert(key, batch.values[i * vs..(i + 1) * vs].to_vec());
        }
        Ok(())
    }

    fn lookup_batch(&self, _map: BorrowedFd<'_>, l: Lookup<'_>) -> (u32, io::Result<()>) {
        if let Err(e) = self.call() {
            return (0, Err(e));
        }
        let (ks, vs) = (self.key_size, self.value_size);
        // The position token: the index of the next entry in key order.
        let at = l.at.map_or(0, |t| {
            u64::from_ne_bytes(t[..8].try_into().unwrap_or_default()) as usize
        });
        let entries = self.entries.borrow();
        let mut n = 0;
        for (k, v) in entries.iter().skip(at).take(l.count as usize) {
            if self.fail_lookup_at == Some(at + n) {
                return (n as u32, Err(io::Error::from_raw_os_error(libc::EIO)));
            }
            l.keys[n * ks..(n + 1) * ks].copy_from_slice(k);
            l.values[n * vs..(n + 1) * vs].copy_from_slice(v);
            n += 1;
        }
        l.next[..8].copy_from_slice(&((at + n) as u64).to_ne_bytes());
        match at + n >= entries.len() {
            true => (n as u32, Err(io::Error::from_raw_os_error(libc::ENOENT))),
            false => (n as u32, Ok(())),
        }
    }

    fn obj_get(&self, _path: &Path) -> io::Result<OwnedFd> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    fn link_detach(&self, _link: BorrowedFd<'_>) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    fn link_next_id(&self, _start: u32) -> io::Result<u32> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}
