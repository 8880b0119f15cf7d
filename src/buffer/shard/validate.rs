//! The shard's part of `SpillBuffer::validate`: its map, lists and hit
//! pins checked against its entries.

use super::Shard;
use crate::buffer::entry::Node;
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

    /// A node's hit pins are open exactly when the node is on a list
    /// (which only an entry in memory is), and a leased one holds a pin of
    /// the node.
    #[cfg(any(test, feature = "testing"))]
    fn validate_hits(&self, i: u32, n: &Node<K, V>) -> Result<(), String> {
        let Some(hits) = &n.hits else {
            return match n.list {
                Some(_) => Err(format!("slot {i} is on a list without hit pins")),
                None => Ok(()),
            };
        };
        if n.state().value().is_none() {
            return Err(format!("slot {i} has hit pins but is {}", n.state().name()));
        }
        if hits.at().slot != i || hits.at().version != n.version {
            return Err(format!("slot {i}: its hit pins are for {:?}", hits.at()));
        }
        if hits.is_open() != n.list.is_some() {
            return Err(format!(
                "slot {i}: hit pins open {}, on list {:?}",
                hits.is_open(),
                n.list
            ));
        }
        if hits.is_leased() && n.pins() == 0 {
            return Err(format!("slot {i}: hit pins leased, entry unpinned"));
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
