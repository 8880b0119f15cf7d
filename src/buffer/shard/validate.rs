//! The shard's part of `SpillBuffer::validate`: its map, lists and hit
//! pins checked against its entries.

use super::Shard;
use crate::buffer::entry::Node;
use crate::sync::Arc;
use std::hash::Hash;

impl<K: Hash + Eq + Clone, V> Shard<K, V> {
    /// Check the lists and the map against the nodes: see
    /// [`Lists::validate`]; and each node is on the list its state asks
    /// for.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate(&self) -> Result<(), String> {
        self.lists.validate(&self.slab)?;
        for (i, n) in self.nodes() {
            if self.find(&n.key) != Some(i) {
                return Err(format!("slot {i} is not the map's slot for its key"));
            }
            self.validate_hits(i, n)?;
            if n.list != n.wanted_list() {
                return Err(format!(
                    "slot {i} ({}, pins {}) on list {:?}, wants {:?}",
                    n.state().name(),
                    n.pins(),
                    n.list,
                    n.wanted_list()
                ));
            }
        }
        if self.map.len() != self.nodes().count() {
            return Err("map and slab disagree on the number of keys".into());
        }
        Ok(())
    }

    /// A node has hit pins exactly while it is on a list, for its version
    /// and value, and its bucket a copy of its key.
    #[cfg(any(test, feature = "testing"))]
    fn validate_hits(&self, i: u32, n: &Node<K, V>) -> Result<(), String> {
        let hits = self.hits_of(i);
        if hits.is_some() != n.list.is_some() {
            return Err(format!(
                "slot {i}: hit pins {}, on list {:?}",
                hits.is_some(),
                n.list
            ));
        }
        let Some(hits) = hits else { return Ok(()) };
        let value = n.state().value();
        if !value.is_some_and(|v| Arc::ptr_eq(v, hits.value())) {
            return Err(format!(
                "slot {i} ({}) has hit pins of another value",
                n.state().name()
            ));
        }
        if hits.at().slot != i || hits.at().version != n.version {
            return Err(format!("slot {i}: its hit pins are for {:?}", hits.at()));
        }
        Ok(())
    }

    /// Keys of `kind` in eviction order.
    #[cfg(test)]
    pub(crate) fn order(&self, kind: crate::buffer::entry::ListKind) -> Vec<K> {
        self.lists
            .order(&self.slab, kind)
            .into_iter()
            .map(|i| self.node(i).key.clone())
            .collect()
    }
}
