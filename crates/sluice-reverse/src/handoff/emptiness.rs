//! Which slices the consumers were told have no session registered (`SLICE ... empty`), so
//! that they hear of each change once, and a consumer that asks for a slice for the first
//! time hears that it is empty. No sockets: the broker does the telling.

use std::collections::BTreeSet;

use sluice_handoff::SliceState;

use crate::slice_id::SliceId;

/// The slices last reported empty; every other slice counts as registered (which is also
/// what a consumer assumes until told otherwise).
#[derive(Debug, Default)]
pub(crate) struct Emptiness {
    empty: BTreeSet<SliceId>,
}

impl Emptiness {
    /// `key` has `alive` sessions now: the state to tell its consumers if that changed.
    pub(crate) fn update(&mut self, key: &SliceId, alive: usize) -> Option<SliceState> {
        if alive == 0 {
            self.empty.insert(key.clone()).then_some(SliceState::Empty)
        } else {
            self.empty.remove(key).then_some(SliceState::Registered)
        }
    }

    /// Whether `key` was last reported empty.
    pub(crate) fn is_empty(&self, key: &SliceId) -> bool {
        self.empty.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_is_told_once() {
        let key = SliceId::new("api", "default");
        let mut e = Emptiness::default();
        assert_eq!(
            e.update(&key, 3),
            None,
            "registered is what consumers assume"
        );
        assert_eq!(e.update(&key, 0), Some(SliceState::Empty));
        assert!(e.is_empty(&key));
        assert_eq!(e.update(&key, 0), None);
        assert_eq!(e.update(&key, 1), Some(SliceState::Registered));
        assert_eq!(e.update(&key, 2), None);
        assert!(!e.is_empty(&key));
        assert!(!e.is_empty(&SliceId::new("api", "other")));
    }
}
