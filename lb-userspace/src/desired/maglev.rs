//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
//! Load Balancer", NSDI 2016, § 3.4): a lookup table of `M` entries (`M` prime) per
//! frontend, each naming a backend, filled from every backend's own permutation of the
//! entries. The table depends only on the backends' names, `M` and the seed, so every node
//! computes the same one and a flow's hash picks the same backend on every node; a backend
//! removed moves about its own share of the entries and few others.
//!
//! Pure functions: the agent computes a frontend's table from its endpoints, the datapath
//! only reads `table[flow_hash % M]` (`lb_common::flow_hash`).

use std::{collections::HashMap, sync::Arc};

use sha2::{Digest, Sha256};

/// Cilium's default table size (`maglev.tableSize`): a prime, about 100 × the backends a
/// large service has, so each backend's share is within about 1% of the mean.
pub const DEFAULT_TABLE_SIZE: u32 = 16381;

/// The table sizes accepted (primes, as Cilium's: each about twice the one before).
pub const TABLE_SIZES: [u32; 7] = [251, 509, 1021, 2039, 4093, 8191, 16381];

/// Whether `n` is prime (the table size must be: every skip then visits every entry).
pub fn is_prime(n: u32) -> bool {
    n >= 2
        && (2..)
            .take_while(|d: &u32| d * d <= n)
            .all(|d| !n.is_multiple_of(d))
}

/// A backend's permutation: where it starts and how far it steps (both from the SHA-256
/// of the seed and its name, so independent of the node and of the Rust version).
fn permutation(seed: &[u8], name: &str, m: u32) -> (u32, u32) {
    let digest = Sha256::new()
        .chain_update(seed)
        .chain_update([0])
        .chain_update(name.as_bytes())
        .finalize();
    let word = |i: usize| u64::from_le_bytes(digest[i..i + 8].try_into().unwrap_or([0; 8]));
    let offset = (word(0) % m as u64) as u32;
    let skip = (word(8) % (m as u64 - 1)) as u32 + 1;
    (offset, skip)
}

/// The Maglev table of size `m` (a prime) over `backends` (their names; the order given
/// does not matter: they are sorted, duplicates dropped): each entry the index of a backend
/// in `names`, the sorted list also returned. Empty without backends.
pub fn table(backends: &[String], m: u32, seed: &[u8]) -> (Vec<String>, Vec<u32>) {
    let mut names: Vec<String> = backends.to_vec();
    names.sort();
    names.dedup();
    if names.is_empty() || m < 2 {
        return (names, Vec::new());
    }
    let perms: Vec<(u32, u32)> = names.iter().map(|n| permutation(seed, n, m)).collect();
    let mut next = vec![0u32; names.len()];
    let mut entry = vec![u32::MAX; m as usize];
    let mut filled = 0u32;
    while filled < m {
        for (i, &(offset, skip)) in perms.iter().enumerate() {
            // The backend's next preferred entry that is still free.
            let mut c = ((offset as u64 + next[i] as u64 * skip as u64) % m as u64) as usize;
            while entry[c] != u32::MAX {
                next[i] += 1;
                c = ((offset as u64 + next[i] as u64 * skip as u64) % m as u64) as usize;
            }
            entry[c] = i as u32;
            next[i] += 1;
            filled += 1;
            if filled == m {
                break;
            }
        }
    }
    (names, entry)
}

/// The Maglev table of size `m` over a frontend's backends in slot order (`backends[i]` in
/// slot `i + 1`), in slot terms: each entry the slot its backend sits in, as the datapath
/// reads it (`XLB_MAGLEV_V2`). A backend named twice keeps its first slot.
pub fn slot_table(backends: &[String], m: u32, seed: &[u8]) -> Vec<u16> {
    let (names, entries) = table(backends, m, seed);
    let mut first: HashMap<&str, u16> = HashMap::with_capacity(backends.len());
    for (i, b) in backends.iter().enumerate() {
        first.entry(b.as_str()).or_insert((i + 1) as u16);
    }
    let slot_of: Vec<u16> = names
        .iter()
        .map(|n| first.get(n.as_str()).copied().unwrap_or(0))
        .collect();
    entries
        .iter()
        .map(|&e| slot_of.get(e as usize).copied().unwrap_or(0))
        .collect()
}

/// A table's cache key: its backends in slot order and its size.
type TableKey = (Box<[String]>, u32);

/// Tables computed before, by backends (in slot order) and size: one table of the largest
/// size takes about half a millisecond, so a full computation at 10,000 frontends would
/// take seconds without it; frontends with the same backends (a Service's NodePorts on
/// every node address, its externalIPs) share one. Entries not used since the last
/// [`TableCache::sweep`] go at the next one; the cache never holds more than `limit` of them
/// (a sweep runs early when it would).
#[derive(Clone, Debug)]
pub struct TableCache {
    seed: Vec<u8>,
    /// (backends, size) → (the table, used since the last sweep).
    tables: HashMap<TableKey, (Arc<[u16]>, bool)>,
    limit: usize,
}

impl Default for TableCache {
    fn default() -> Self {
        Self {
            seed: Vec::new(),
            tables: HashMap::new(),
            limit: 4 * lb_common::MAGLEV_MAP_CAPACITY as usize,
        }
    }
}

impl TableCache {
    /// The slot table of `backends` (in slot order) of size `m` under `seed`, computed
    /// unless cached.
    pub fn get(&mut self, backends: &[String], m: u32, seed: &[u8]) -> Arc<[u16]> {
        if self.seed != seed {
            self.tables.clear();
            self.seed = seed.to_vec();
        }
        let key = (backends.to_vec().into_boxed_slice(), m);
        if let Some((t, used)) = self.tables.get_mut(&key) {
            *used = true;
            return t.clone();
        }
        if self.tables.len() >= self.limit {
            self.sweep();
            if self.tables.len() >= self.limit {
                self.tables.clear();
            }
        }
        let t: Arc<[u16]> = slot_table(backends, m, seed).into();
        self.tables.insert(key, (t.clone(), true));
        t
    }

    /// Drops the tables not asked for since the last sweep (the agent sweeps after each
    /// full computation).
    pub fn sweep(&mut self) {
        self.tables.retain(|_, (_, used)| std::mem::take(used));
    }

    /// How many tables it holds.
    pub fn len(&self) -> usize {
        self.tables.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.244.{i}.2:8080")).collect()
    }

    /// Each name's backend per entry.
    fn resolved(backends: &[String], m: u32) -> Vec<String> {
        let (sorted, t) = table(backends, m, b"xlb");
        t.iter().map(|i| sorted[*i as usize].clone()).collect()
    }

    #[test]
    fn the_sizes_are_prime_and_the_default_among_them() {
        assert!(TABLE_SIZES.iter().all(|m| is_prime(*m)));
        assert!(TABLE_SIZES.contains(&DEFAULT_TABLE_SIZE));
        assert!(!is_prime(16383) && !is_prime(1) && is_prime(2));
    }

    #[test]
    fn every_node_computes_the_same_table_whatever_the_order_it_learnt_the_backends_in() {
        let a = names(10);
        let mut b = a.clone();
        b.reverse();
        b.push(a[3].clone());
        assert_eq!(resolved(&a, 1021), resolved(&b, 1021));
        // Another seed is another table.
        let (_, t1) = table(&a, 1021, b"xlb");
        let (_, t2) = table(&a, 1021, b"other");
        assert_ne!(t1, t2);
    }

    #[test]
    fn every_backend_gets_its_share_of_the_entries() {
        for (n, m) in [(3, 251), (10, 16381), (100, 16381)] {
            let (_, t) = table(&names(n), m, b"xlb");
            let mut counts = vec![0u32; n];
            for i in &t {
                counts[*i as usize] += 1;
            }
            let mean = m as f64 / n as f64;
            let (lo, hi) = (
                *counts.iter().min().unwrap_or(&0),
                *counts.iter().max().unwrap_or(&0),
            );
            // The paper: within a few percent of the mean for M ≫ N.
            assert!(
                (lo as f64) > mean * 0.9 && (hi as f64) < mean * 1.1,
                "{n} backends over {m}: {lo}..{hi} (mean {mean:.1})"
            );
        }
    }

    #[test]
    fn removing_a_backend_moves_its_own_entries_and_few_others() {
        let all = names(10);
        let before = resolved(&all, 16381);
        let gone = all[4].clone();
        let rest: Vec<String> = all.iter().filter(|n| **n != gone).cloned().collect();
        let after = resolved(&rest, 16381);
        let own = before.iter().filter(|b| **b == gone).count();
        let others_moved = before
            .iter()
            .zip(&after)
            .filter(|(b, a)| **b != gone && b != a)
            .count();
        // Every entry of the removed backend moves; of the others, the paper measures a
        // few percent at most.
        assert!(own > 1400, "{own}");
        assert!(
            others_moved * 100 < 16381 * 3,
            "{others_moved} entries of staying backends moved"
        );
    }

    #[test]
    fn a_slot_table_names_each_backends_slot_and_is_cached_by_backends_and_size() {
        let all = names(5);
        let t = slot_table(&all, 251, b"xlb");
        let by_name = resolved(&all, 251);
        for (slot, name) in t.iter().zip(&by_name) {
            assert_eq!(&all[*slot as usize - 1], name);
        }
        let mut cache = TableCache::default();
        let a = cache.get(&all, 251, b"xlb");
        assert!(Arc::ptr_eq(&a, &cache.get(&all, 251, b"xlb")));
        assert_eq!(&*a, &t[..]);
        let _ = cache.get(&all, 509, b"xlb");
        assert_eq!(cache.len(), 2);
        cache.sweep();
        let _ = cache.get(&all, 251, b"xlb");
        cache.sweep();
        assert_eq!(cache.len(), 1, "the unused size went at the second sweep");
        let _ = cache.get(&all, 251, b"other");
        assert_eq!(cache.len(), 1, "another seed starts afresh");
    }

    #[test]
    fn no_backends_no_table() {
        assert_eq!(table(&[], 251, b"xlb"), (Vec::new(), Vec::new()));
        let (n, t) = table(&names(1), 251, b"xlb");
        assert_eq!((n.len(), t.len()), (1, 251));
        assert!(t.iter().all(|i| *i == 0));
    }
}
