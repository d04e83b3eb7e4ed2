//! The keys of a desired state one change names.

use std::collections::BTreeSet;

use lb_common::SvcKey;

use super::SrcRange;

/// What an update changed, for [`crate::datapath::sync::apply_touched`]: only these keys,
/// indices and bits are compared with the maps and written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// Frontend entries (either scope) added, changed or gone.
    pub frontends: BTreeSet<SvcKey>,
    pub backends: BTreeSet<u32>,
    pub src_ranges: BTreeSet<SrcRange>,
    /// Filter words (`bit / 64`) that may differ.
    pub filter_words: BTreeSet<u32>,
    /// Maglev tables (by service index) added, changed or gone.
    pub maglev: BTreeSet<u32>,
}

impl Touched {
    pub fn is_empty(&self) -> bool {
        self.frontends.is_empty()
            && self.backends.is_empty()
            && self.src_ranges.is_empty()
            && self.filter_words.is_empty()
            && self.maglev.is_empty()
    }

    /// Adds what `other` names.
    pub fn extend(&mut self, other: Touched) {
        self.frontends.extend(other.frontends);
        self.backends.extend(other.backends);
        self.src_ranges.extend(other.src_ranges);
        self.filter_words.extend(other.filter_words);
        self.maglev.extend(other.maglev);
    }
}
