//! [`Dense`]: a map from a dense index (a backend's, a service's) to its value, as an array
//! indexed by it rather than a B-tree: one allocation (mapped on its own when large, so it
//! leaves no holes in the heap when it grows or goes), a lookup or an insert without a
//! walk, entries in index order as a `BTreeMap<u32, V>`'s are (its API, so the desired
//! state reads the same). A sparse map (a journal's few entries, a stray high index) stays
//! a B-tree: the array covers indices only while at least half of them are held.

use std::{collections::BTreeMap, fmt, ops::Index};

/// Entries the B-tree holds before they may move into the array.
const ABSORB_MIN: usize = 32;

/// Index → value, in index order.
#[derive(Clone)]
pub struct Dense<V> {
    /// Entry `i` holds index `i` (with its index, so iterators hand out `&u32` as a
    /// B-tree's do).
    array: Vec<Option<(u32, V)>>,
    /// Indices from `array.len()` up (so the array's entries come first in index order).
    spill: BTreeMap<u32, V>,
    len: usize,
}

impl<V> Default for Dense<V> {
    fn default() -> Self {
        Self {
            array: Vec::new(),
            spill: BTreeMap::new(),
            len: 0,
        }
    }
}

/// Equal when they hold the same entries (whatever room each array has past them).
impl<V: PartialEq> PartialEq for Dense<V> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<V: Eq> Eq for Dense<V> {}

impl<V> Dense<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, id: &u32) -> Option<&V> {
        match (*id as usize) < self.array.len() {
            true => self.array[*id as usize].as_ref().map(|(_, v)| v),
            false => self.spill.get(id),
        }
    }

    pub fn contains_key(&self, id: &u32) -> bool {
        self.get(id).is_some()
    }

    /// Sets `id` to `v`; returns what it held.
    pub fn insert(&mut self, id: u32, v: V) -> Option<V> {
        // The array stays at least half full.
        let next = id as usize == self.array.len()
            && self.spill.is_empty()
            && 2 * (self.len + 1) > self.array.len();
        if next {
            // The next index after the array's (indices handed out in order, as a cold
            // start's are): appended, no B-tree on the way.
            self.array.push(Some((id, v)));
            self.len += 1;
            return None;
        }
        let old = match (id as usize) < self.array.len() {
            true => self.array[id as usize].replace((id, v)).map(|(_, v)| v),
            false => self.spill.insert(id, v),
        };
        if old.is_none() {
            self.len += 1;
            self.absorb();
        }
        old
    }

    /// Moves the B-tree's entries into the array when it has enough of them and the array
    /// grown to hold them would be at least half full (each move at least an eighth of
    /// the array's length: amortized, an insert moves an entry a constant number of times).
    fn absorb(&mut self) {
        let enough = ABSORB_MIN.max(self.array.len() / 8);
        if self.spill.len() < enough {
            return;
        }
        let Some((&last, _)) = self.spill.last_key_value() else {
            return;
        };
        let size = last as usize + 1;
        if size > 2 * self.len {
            return;
        }
        self.array.resize_with(size, || None);
        for (k, v) in std::mem::take(&mut self.spill) {
            self.array[k as usize] = Some((k, v));
        }
    }

    /// Takes `id` out; returns what it held.
    pub fn remove(&mut self, id: &u32) -> Option<V> {
        let old = match (*id as usize) < self.array.len() {
            true => self.array[*id as usize].take().map(|(_, v)| v),
            false => self.spill.remove(id),
        };
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// Entries in index order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&u32, &V)> {
        self.array
            .iter()
            .filter_map(|e| e.as_ref().map(|(k, v)| (k, v)))
            .chain(self.spill.iter())
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &u32> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Keeps the entries `keep` says to.
    pub fn retain(&mut self, mut keep: impl FnMut(&u32, &mut V) -> bool) {
        for e in &mut self.array {
            if let Some((k, v)) = e
                && !keep(k, v)
            {
                *e = None;
                self.len -= 1;
            }
        }
        let before = self.spill.len();
        self.spill.retain(|k, v| keep(k, v));
        self.len -= before - self.spill.len();
    }

    /// Room for `additional` more indices past the array's (handed out in order, as a cold
    /// start's are: the array grows once).
    pub fn reserve(&mut self, additional: usize) {
        self.array.reserve(additional);
    }

    /// Gives back the room past the highest index held.
    pub fn shrink_to_fit(&mut self) {
        let used = self
            .array
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1);
        self.array.truncate(used);
        self.array.shrink_to_fit();
    }
}

impl<V> Index<&u32> for Dense<V> {
    type Output = V;

    fn index(&self, id: &u32) -> &V {
        self.get(id).expect("no entry for the index")
    }
}

impl<V> Extend<(u32, V)> for Dense<V> {
    fn extend<I: IntoIterator<Item = (u32, V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(k, v);
        }
    }
}

impl<'a, V: Copy + 'a> Extend<(&'a u32, &'a V)> for Dense<V> {
    fn extend<I: IntoIterator<Item = (&'a u32, &'a V)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(*k, *v);
        }
    }
}

impl<V> FromIterator<(u32, V)> for Dense<V> {
    fn from_iter<I: IntoIterator<Item = (u32, V)>>(iter: I) -> Self {
        let mut d = Dense::default();
        d.extend(iter);
        d
    }
}

impl<const N: usize, V> From<[(u32, V); N]> for Dense<V> {
    fn from(entries: [(u32, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<V> IntoIterator for Dense<V> {
    type Item = (u32, V);
    type IntoIter = std::iter::Chain<
        std::iter::Flatten<std::vec::IntoIter<Option<(u32, V)>>>,
        std::collections::btree_map::IntoIter<u32, V>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.array.into_iter().flatten().chain(self.spill)
    }
}

impl<'a, V> IntoIterator for &'a Dense<V> {
    type Item = (&'a u32, &'a V);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a u32, &'a V)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<V: fmt::Debug> fmt::Debug for Dense<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_as_an_ordered_map_whatever_the_index() {
        let mut d = Dense::default();
        assert_eq!(d.insert(7, "seven"), None);
        assert_eq!(d.insert(u32::MAX, "max"), None);
        assert_eq!(d.insert(2, "two"), None);
        assert_eq!(d.insert(7, "SEVEN"), Some("seven"));
        assert_eq!(d.len(), 3);
        let keys: Vec<u32> = d.keys().copied().collect();
        assert_eq!(keys, [2, 7, u32::MAX], "index order, spill last");
        assert_eq!(d[&7], "SEVEN");
        assert_eq!(d.remove(&2), Some("two"));
        assert_eq!(d.remove(&2), None);
        assert_eq!(d.remove(&u32::MAX), Some("max"));
        assert!(!d.contains_key(&u32::MAX) && d.contains_key(&7));
        assert_eq!(d.len(), 1);
        d.retain(|_, _| false);
        assert!(d.is_empty());
        // Equal contents are equal whatever room each array kept.
        assert_eq!(d, Dense::default());
        d.shrink_to_fit();
        assert_eq!(d.array.len(), 0);
        assert_eq!(format!("{:?}", Dense::from([(1, 'a')])), "{1: 'a'}");
    }

    #[test]
    fn an_array_only_while_dense() {
        // A few high indices (a journal's): no array.
        let sparse: Dense<u32> = (0..40).map(|i| (100_000 + i * 1000, i)).collect();
        assert_eq!(sparse.array.len(), 0);
        assert_eq!(sparse.len(), 40);
        // Indices from 1 up: an array, in order, with a stray index kept beside it.
        let mut d: Dense<u32> = (1..=1000).map(|i| (i, i * 2)).collect();
        d.insert(u32::MAX, 7);
        assert!(
            d.array.len() >= 900 && d.array.len() <= 1001,
            "{}",
            d.array.len()
        );
        assert_eq!(d.len(), 1001);
        assert_eq!(d.get(&500), Some(&1000));
        assert_eq!(d.get(&u32::MAX), Some(&7));
        let keys: Vec<u32> = d.keys().copied().collect();
        let want: Vec<u32> = (1..=1000).chain([u32::MAX]).collect();
        assert_eq!(keys, want);
        // Emptied, the next index past the array is not appended to it (it would be
        // mostly empty).
        d.retain(|_, _| false);
        let len = d.array.len();
        d.insert(len as u32, 1);
        assert_eq!((d.array.len(), d.spill.len()), (len, 1));
    }
}
