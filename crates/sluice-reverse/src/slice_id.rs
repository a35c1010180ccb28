//! [`SliceId`]: which slice of which reverse cluster.

use std::fmt;

/// A (cluster, slice) pair: where a session belongs, and what credit, recalls and hand-overs
/// are counted by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceId {
    /// The reverse cluster's name.
    pub cluster: String,
    /// The slice's name.
    pub slice: String,
}

impl SliceId {
    /// Slice `slice` of cluster `cluster`.
    pub fn new(cluster: impl Into<String>, slice: impl Into<String>) -> Self {
        Self {
            cluster: cluster.into(),
            slice: slice.into(),
        }
    }
}

impl fmt::Display for SliceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.cluster, self.slice)
    }
}
