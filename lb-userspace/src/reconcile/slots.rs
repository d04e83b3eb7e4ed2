//! Slot ranges: where each frontend's backend slots sit in the slot array (`XLB_SLOT_V1`).
//!
//! A buddy allocator over `0..capacity`: a frontend of `n` backends gets a range of the
//! power of two at or above `n` (at most `MAX_BACKENDS_PER_SVC`, one of [`ORDERS`] size
//! classes), aligned to its size, so it grows in place up to its class and a freed range
//! merges with its free buddy into the class above. A frontend that outgrows its range, or
//! shrinks to a quarter of it, gets a new one (make-before-break: the reconciler writes the
//! new slots, then flips the entry); the old range is held until the maps are known to hold
//! the new entry ([`Slots::confirm`], after a sync without a failed write) and reused only
//! [`super::ids::QUARANTINE`] after that, so a packet that read the old entry never reads
//! another frontend's slots. A range handed out but never programmed is free again at once.
//!
//! What fragmentation costs: a range is up to twice its frontend's slots (10 backends take
//! 16 slots, 64 B of the array where 40 B are used); the quarter rule bounds a shrunk
//! frontend's waste to 4×; freed ranges wait out the quarantine before they merge back.
//! A full array leaves a frontend the largest free range below its class (the first
//! backends that fit), as a full service map does.

use std::{
    collections::{BTreeSet, VecDeque},
    time::Instant,
};

use foldhash::{HashMap, HashSet};
use lb_common::{MAX_BACKENDS_PER_SVC, SvcKey};

use super::ids::QUARANTINE;

/// Size classes: ranges of 1, 2, 4, … `MAX_BACKENDS_PER_SVC` slots.
pub const ORDERS: usize = MAX_BACKENDS_PER_SVC.trailing_zeros() as usize + 1;
const _: () = assert!(MAX_BACKENDS_PER_SVC.is_power_of_two());

/// A range of slots: `base..base + 2^order`, aligned to its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Range {
    pub base: u32,
    pub order: u8,
}

impl Range {
    /// Its slots.
    pub fn size(self) -> u32 {
        1 << self.order
    }

    fn end(self) -> u64 {
        self.base as u64 + self.size() as u64
    }
}

/// The size class of `n` (≥ 1) slots.
fn order_for(n: u16) -> u8 {
    n.max(1).next_power_of_two().trailing_zeros() as u8
}

/// The slot ranges of every frontend, the free ones and those in quarantine.
#[derive(Clone, Debug, Default)]
pub struct Slots {
    /// The array's size once known (the first [`Slots::range`]); 0 before.
    capacity: u32,
    /// Free ranges by order (bases, lowest handed out first).
    free: [BTreeSet<u32>; ORDERS],
    /// Frontend (entry key, either scope) → its range.
    ranges: HashMap<SvcKey, Range>,
    /// Ranges given back while programmed, oldest first, with when the maps stopped
    /// naming them.
    quarantine: VecDeque<(Range, Instant)>,
    /// Given back while programmed, until [`Slots::confirm`].
    held: Vec<Range>,
    /// Bases handed out since the last [`Slots::retain`] (never programmed yet).
    fresh: HashSet<u32>,
    /// Adopted ranges, until the capacity is known; then when they were adopted.
    adopted: Vec<(SvcKey, Range)>,
    adopted_at: Option<Instant>,
}

impl Slots {
    /// Takes over the ranges of what is programmed (`(frontend, base, count)`): each keeps
    /// the aligned range of its class at its base (one that is misaligned or overlaps
    /// another is not adopted: that frontend moves). The free space below the highest
    /// adopted range is in quarantine from `now` (a flow of the previous agent may read it).
    pub fn adopt(programmed: impl IntoIterator<Item = (SvcKey, u32, u16)>, now: Instant) -> Self {
        let adopted = programmed
            .into_iter()
            .filter(|&(_, _, count)| count > 0)
            .map(|(k, base, count)| {
                let r = Range {
                    base,
                    order: order_for(count),
                };
                (k, r)
            })
            .filter(|(_, r)| r.base.is_multiple_of(r.size()))
            .collect();
        Self {
            adopted,
            adopted_at: Some(now),
            ..Self::default()
        }
    }

    /// The range of frontend `key` for `count` slots in an array of `capacity`: its base
    /// and how many slots it has (fewer than `count` when the array has no range that
    /// large: the frontend keeps its first backends that fit). `(0, 0)` for no slots;
    /// `None` when not one slot is free.
    pub fn range(
        &mut self,
        key: SvcKey,
        count: u16,
        capacity: u32,
        now: Instant,
    ) -> Option<(u32, u16)> {
        self.size_to(capacity, now);
        self.release_expired(now);
        let current = self.ranges.get(&key).copied();
        if count == 0 {
            if let Some(r) = self.ranges.remove(&key) {
                self.give_back(r);
            }
            return Some((0, 0));
        }
        let want = order_for(count);
        if let Some(r) = current {
            let fits = r.size() >= count as u32;
            let shrunk = r.order > want && (count as u32) * 4 <= r.size();
            if fits && !shrunk {
                return Some((r.base, room(r)));
            }
        }
        let new = match self.take(want) {
            Some(r) => r,
            // No range of its class: it keeps the one it has, else takes the largest free.
            None => match current {
                Some(r) => return Some((r.base, room(r))),
                None => (0..want).rev().find_map(|o| self.take(o))?,
            },
        };
        self.fresh.insert(new.base);
        if let Some(old) = self.ranges.insert(key, new) {
            self.give_back(old);
        }
        Some((new.base, room(new)))
    }

    /// Room for ranges of `frontends` frontends in all.
    pub fn reserve(&mut self, frontends: usize) {
        self.ranges
            .reserve(frontends.saturating_sub(self.ranges.len()));
    }

    /// The range of `key`, if it has one.
    pub fn get(&self, key: &SvcKey) -> Option<Range> {
        self.ranges.get(key).copied()
    }

    /// Gives back the ranges of the frontends `keep` says are gone; what was handed out
    /// since the last call is programmed from now.
    pub fn retain(&mut self, keep: impl Fn(&SvcKey) -> bool) {
        let gone: Vec<SvcKey> = self.ranges.keys().filter(|k| !keep(k)).copied().collect();
        self.give_back_all(gone);
    }

    /// [`Slots::retain`] among `keys` only (those an incremental computation touched).
    pub fn retain_touched<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a SvcKey>,
        keep: impl Fn(&SvcKey) -> bool,
    ) {
        let gone: Vec<SvcKey> = keys
            .into_iter()
            .filter(|k| !keep(k) && self.ranges.contains_key(k))
            .copied()
            .collect();
        self.give_back_all(gone);
    }

    fn give_back_all(&mut self, mut gone: Vec<SvcKey>) {
        gone.sort_unstable();
        for k in gone {
            if let Some(r) = self.ranges.remove(&k) {
                self.give_back(r);
            }
        }
        self.fresh.clear();
    }

    /// Sizes the array the first time it is known: free blocks above the highest adopted
    /// range, those below it in quarantine.
    fn size_to(&mut self, capacity: u32, now: Instant) {
        if self.capacity == capacity {
            return;
        }
        // Capacity is fixed while an agent runs; a change (tests) starts afresh.
        let adopted = std::mem::take(&mut self.adopted);
        let mut kept: Vec<(SvcKey, Range)> = adopted
            .into_iter()
            .chain(self.ranges.drain())
            .filter(|(_, r)| r.end() <= capacity as u64)
            .collect();
        kept.sort_unstable_by_key(|(k, r)| (r.base, *k));
        let mut top = 0u64;
        let mut holes = Vec::new();
        for (k, r) in kept {
            if (r.base as u64) < top {
                continue; // overlaps the one before: this frontend moves
            }
            holes.extend(blocks(top, r.base as u64));
            top = r.end();
            self.ranges.insert(k, r);
        }
        let since = self.adopted_at.unwrap_or(now);
        let held = std::mem::take(&mut self.held)
            .into_iter()
            .filter(|r| r.end() <= capacity as u64)
            .collect();
        *self = Self {
            capacity,
            ranges: std::mem::take(&mut self.ranges),
            held,
            ..Self::default()
        };
        self.quarantine
            .extend(holes.into_iter().map(|r| (r, since)));
        for r in blocks(top, capacity as u64) {
            self.free(r);
        }
    }

    /// A free range of `order`, split from a larger one when none of that size is free.
    fn take(&mut self, order: u8) -> Option<Range> {
        let from = (order as usize..ORDERS).find(|&o| !self.free[o].is_empty())?;
        let base = self.free[from].pop_first()?;
        for o in (order as usize..from).rev() {
            self.free[o].insert(base + (1 << o));
        }
        Some(Range { base, order })
    }

    /// `r` back: at once when it was never programmed, else held until
    /// [`Slots::confirm`] starts its quarantine.
    fn give_back(&mut self, r: Range) {
        if self.fresh.remove(&r.base) {
            self.free(r);
        } else {
            self.held.push(r);
        }
    }

    /// The maps no longer name the held ranges: their quarantine starts `now`.
    pub fn confirm(&mut self, now: Instant) {
        self.quarantine
            .extend(self.held.drain(..).map(|r| (r, now)));
    }

    /// Ranges whose quarantine is over, free.
    fn release_expired(&mut self, now: Instant) {
        while let Some(&(r, since)) = self.quarantine.front() {
            if now.saturating_duration_since(since) < QUARANTINE {
                break;
            }
            self.quarantine.pop_front();
            self.free(r);
        }
    }

    /// Frees `r`, merged with its buddy while that is free.
    fn free(&mut self, mut r: Range) {
        while (r.order as usize) < ORDERS - 1 {
            let buddy = r.base ^ r.size();
            if !self.free[r.order as usize].remove(&buddy) {
                break;
            }
            r = Range {
                base: r.base.min(buddy),
                order: r.order + 1,
            };
        }
        self.free[r.order as usize].insert(r.base);
    }

    /// Ranges held until [`Slots::confirm`].
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.held.len()
    }

    /// Free slots (not in quarantine, not in use).
    #[cfg(test)]
    fn free_slots(&self) -> u32 {
        (0..ORDERS).map(|o| (self.free[o].len() as u32) << o).sum()
    }
}

/// How many slots range `r` gives (at most `MAX_BACKENDS_PER_SVC`).
fn room(r: Range) -> u16 {
    r.size().min(MAX_BACKENDS_PER_SVC as u32) as u16
}

/// `lo..hi` as aligned ranges, each as large as its alignment allows.
fn blocks(lo: u64, hi: u64) -> Vec<Range> {
    let mut out = Vec::new();
    let mut p = lo;
    while p < hi {
        let mut order = (ORDERS - 1) as u8;
        while !p.is_multiple_of(1u64 << order) || p + (1u64 << order) > hi {
            order -= 1;
        }
        out.push(Range {
            base: p as u32,
            order,
        });
        p += 1u64 << order;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use lb_common::user::frontend_key;

    use super::*;
    use crate::model::Protocol;

    fn fe(i: u8) -> SvcKey {
        frontend_key(Ipv4Addr::new(10, 96, 0, i), 80, Protocol::Tcp)
    }

    #[test]
    fn a_frontend_grows_in_place_up_to_its_class_then_moves() {
        let t0 = Instant::now();
        let mut s = Slots::default();
        assert_eq!(s.range(fe(1), 3, 64, t0), Some((0, 4)));
        assert_eq!(s.range(fe(2), 1, 64, t0), Some((4, 1)));
        s.retain(|_| true);
        assert_eq!(s.range(fe(1), 4, 64, t0), Some((0, 4)), "in place");
        // Outgrows its class: a new range of 8, aligned; the old one is in quarantine.
        assert_eq!(s.range(fe(1), 5, 64, t0), Some((8, 8)));
        s.retain(|_| true);
        assert_eq!(s.range(fe(3), 4, 64, t0), Some((16, 4)), "0..4 not reused");
        s.retain(|_| true);
        s.confirm(t0);
        // After the quarantine it is.
        assert_eq!(s.range(fe(4), 4, 64, t0 + QUARANTINE), Some((0, 4)));
    }

    #[test]
    fn a_moved_range_waits_for_the_maps_to_drop_it_before_its_quarantine_starts() {
        let t0 = Instant::now();
        let mut s = Slots::default();
        assert_eq!(s.range(fe(1), 4, 16, t0), Some((0, 4)));
        assert_eq!(s.range(fe(2), 4, 16, t0), Some((4, 4)));
        s.retain(|_| true);
        s.confirm(t0);
        // Moved to 8..16, but the sync that writes its new entry fails: no confirmation.
        assert_eq!(s.range(fe(1), 5, 16, t0), Some((8, 8)));
        s.retain(|_| true);
        let later = t0 + QUARANTINE * 3;
        assert_eq!(
            s.range(fe(3), 1, 16, later),
            None,
            "0..4 held while the kernel entry may still name it"
        );
        // The entry is written: its quarantine starts then.
        s.confirm(later);
        assert_eq!(s.range(fe(3), 1, 16, later), None, "in quarantine");
        assert_eq!(
            s.range(fe(3), 1, 16, later + QUARANTINE),
            Some((0, 1)),
            "after it"
        );
    }

    #[test]
    fn a_range_never_programmed_is_free_at_once_and_buddies_merge() {
        let t0 = Instant::now();
        let mut s = Slots::default();
        assert_eq!(s.range(fe(1), 2, 8, t0), Some((0, 2)));
        assert_eq!(s.range(fe(2), 2, 8, t0), Some((2, 2)));
        // Neither programmed: both free at once, merged back into one range of 8.
        s.retain(|_| false);
        assert_eq!(s.free_slots(), 8);
        assert_eq!(s.range(fe(3), 8, 8, t0), Some((0, 8)));
    }

    #[test]
    fn a_shrunk_frontend_moves_to_a_smaller_class_and_an_empty_one_holds_none() {
        let t0 = Instant::now();
        let mut s = Slots::default();
        assert_eq!(s.range(fe(1), 16, 64, t0), Some((0, 16)));
        s.retain(|_| true);
        assert_eq!(s.range(fe(1), 5, 64, t0), Some((0, 16)), "a half: stays");
        assert_eq!(s.range(fe(1), 4, 64, t0), Some((16, 4)), "a quarter: moves");
        s.retain(|_| true);
        assert_eq!(s.range(fe(1), 0, 64, t0), Some((0, 0)));
        assert_eq!(s.get(&fe(1)), None);
    }

    #[test]
    fn a_full_array_gives_the_largest_free_range_then_none() {
        let t0 = Instant::now();
        let mut s = Slots::default();
        // 6 slots: ranges 0..4 and 4..6.
        assert_eq!(s.range(fe(1), 4, 6, t0), Some((0, 4)));
        assert_eq!(s.range(fe(2), 3, 6, t0), Some((4, 2)), "the first two fit");
        assert_eq!(s.range(fe(3), 1, 6, t0), None);
        // One that had a range keeps it when its class has no room.
        s.retain(|_| true);
        assert_eq!(s.range(fe(1), 5, 6, t0), Some((0, 4)));
    }

    #[test]
    fn the_last_range_of_a_capacity_that_is_no_power_of_two_is_used() {
        let t0 = Instant::now();
        let mut s = Slots::default();
        let cap = 4096 + 3;
        assert_eq!(s.range(fe(1), 4096, cap, t0), Some((0, 4096)));
        assert_eq!(s.range(fe(2), 2, cap, t0), Some((4096, 2)));
        assert_eq!(
            s.range(fe(3), 1, cap, t0),
            Some((4098, 1)),
            "the array's end"
        );
        assert_eq!(s.range(fe(4), 1, cap, t0), None);
    }

    #[test]
    fn adopted_ranges_stay_and_the_holes_below_them_wait_out_the_quarantine() {
        let t0 = Instant::now();
        let mut s = Slots::adopt([(fe(1), 8, 3), (fe(2), 9, 1), (fe(3), 12, 2)], t0);
        assert_eq!(s.range(fe(1), 3, 64, t0), Some((8, 4)), "adopted");
        assert_eq!(s.get(&fe(2)), None, "overlapping: not adopted");
        assert_eq!(
            s.range(fe(2), 1, 64, t0),
            Some((14, 1)),
            "above the highest"
        );
        assert_eq!(s.range(fe(3), 2, 64, t0), Some((12, 2)));
        s.retain(|_| true);
        let later = t0 + QUARANTINE + Duration::from_secs(1);
        assert_eq!(
            s.range(fe(4), 8, 64, later),
            Some((0, 8)),
            "the hole, later"
        );
    }
}
