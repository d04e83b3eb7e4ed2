//! Shared names: namespaces, Service, port and node names and zones are held once and
//! shared (a reference count, not a string per endpoint or per frontend). [`intern`] hands
//! out the one copy of a name; names nothing holds any more are dropped from the table when
//! it has doubled since the last sweep, so it never outgrows what the model names.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

/// A shared, immutable name (compares, orders and hashes as its text).
pub type Name = Arc<str>;

struct Table {
    names: HashSet<Arc<str>>,
    /// The table's size after the last sweep.
    swept: usize,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The shared copy of `s`.
pub fn intern(s: &str) -> Name {
    let mut guard = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let t = guard.get_or_insert_with(|| Table {
        names: HashSet::new(),
        swept: 0,
    });
    if let Some(n) = t.names.get(s) {
        return n.clone();
    }
    if t.names.len() >= 2 * t.swept.max(1024) {
        // Only the table holds these.
        t.names.retain(|n| Arc::strong_count(n) > 1);
        t.swept = t.names.len();
    }
    let n: Name = Arc::from(s);
    t.names.insert(n.clone());
    n
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
            .map(|t| t.as_ref().map_or(0, |t| t.names.len()))
            .unwrap_or(usize::MAX);
        assert!(len < 6000, "{len}");
    }
}
