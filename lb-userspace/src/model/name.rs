//! Shared names: namespaces, Service, port and node names and zones are held once and
//! shared (a reference count, not a string per endpoint or per frontend). [`intern`] hands
//! out the one copy of a name; names nothing holds any more are dropped from the table when
//! it has doubled since the last sweep, so it never outgrows what the model names.

use std::{
    collections::HashSet,
    hash::Hash,
    sync::{Arc, Mutex},
};

/// A shared, immutable name (compares, orders and hashes as its text).
pub type Name = Arc<str>;

/// Shared copies of values: [`Interner::get`] hands out the one copy of a value; copies
/// nothing else holds any more are dropped when the table has doubled since the last sweep,
/// so it never outgrows what is held.
pub(crate) struct Interner<T: ?Sized> {
    held: HashSet<Arc<T>>,
    /// The table's size after the last sweep.
    swept: usize,
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    pub(crate) fn new() -> Self {
        Self {
            held: HashSet::new(),
            swept: 0,
        }
    }

    /// The shared copy of `v` (`make` makes one when there is none).
    pub(crate) fn get(&mut self, v: &T, make: impl FnOnce() -> Arc<T>) -> Arc<T> {
        if let Some(n) = self.held.get(v) {
            return n.clone();
        }
        if self.held.len() >= 2 * self.swept.max(1024) {
            // Only the table holds these.
            self.held.retain(|n| Arc::strong_count(n) > 1);
            self.swept = self.held.len();
        }
        let n = make();
        self.held.insert(n.clone());
        n
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len()
    }
}

static TABLE: Mutex<Option<Interner<str>>> = Mutex::new(None);

/// The shared copy of `s`.
pub fn intern(s: &str) -> Name {
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    guard
        .get_or_insert_with(Interner::new)
        .get(s, || Arc::from(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_held_once_and_dropped_when_nothing_holds_it() {
        let a = intern("kube-system");
        let b = intern(&String::from("kube-system"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "kube-system");
        drop((a, b));
        // Enough other names to trigger a sweep: the table stays bounded.
        let held: Vec<Name> = (0..5000).map(|i| intern(&format!("n{i}"))).collect();
        drop(held);
        for i in 0..5000 {
            intern(&format!("m{i}"));
        }
        let len = TABLE
            .lock()
            .map(|t| t.as_ref().map_or(0, |t| t.len()))
            .unwrap_or(usize::MAX);
        assert!(len < 6000, "{len}");
    }
}
