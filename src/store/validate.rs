//! The store's part of `SpillBuffer::validate`: the segment table checked
//! against the counters.

use super::{DiskLoc, Store};
use std::fmt::Debug;

impl<K: Clone + Debug> Store<K> {
    #[cfg(any(test, feature = "testing"))]
    /// The key of the live record at `loc` (same segment, offset and
    /// length), if there is one. For `validate`.
    pub(crate) fn record_key(&self, loc: DiskLoc) -> Option<K> {
        let g = self.inner.lock();
        let (len, key) = g.segs.get(&loc.seg)?.records.get(&loc.offset)?;
        (*len == loc.len()).then(|| key.clone())
    }

    /// Check the segment table against the counters.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn validate(&self) -> std::result::Result<(), String> {
        let g = self.inner.lock();
        let (mut live, mut count, mut end) = (0u64, 0u64, 0u64);
        for (id, s) in &g.segs {
            let sum: u64 = s.records.values().map(|(l, _)| l).sum();
            if sum != s.live {
                return Err(format!("segment {id}: live {} != record sum {sum}", s.live));
            }
            if s.live > s.end {
                return Err(format!("segment {id}: live {} > end {}", s.live, s.end));
            }
            for (&off, &(len, _)) in &s.records {
                if off + len > s.end {
                    return Err(format!("segment {id}: record at {off} passes the end"));
                }
                if s.holes.iter().any(|&(a, b)| off < b && a < off + len) {
                    return Err(format!("segment {id}: record at {off} lies in a hole"));
                }
            }
            let holes: u64 = s.holes.iter().map(|(a, b)| b - a).sum();
            let ordered = s.holes.windows(2).all(|w| w[0].1 < w[1].0);
            let aligned = s.holes.iter().all(|&(a, b)| {
                a % super::storage::PUNCH_BLOCK == 0
                    && b % super::storage::PUNCH_BLOCK == 0
                    && a < b
                    && b <= s.end
            });
            if holes != s.punched || !ordered || !aligned {
                return Err(format!(
                    "segment {id}: holes {:?} do not add up to {} punched bytes",
                    s.holes, s.punched
                ));
            }
            live += s.live;
            count += s.records.len() as u64;
            end += s.end - s.punched;
        }
        if live != self.disk_bytes() || count != self.disk_count() {
            return Err(format!(
                "disk_bytes/count {}/{} != segments {live}/{count}",
                self.disk_bytes(),
                self.disk_count()
            ));
        }
        if end != self.file_bytes() {
            return Err(format!(
                "file_bytes {} != segments {end}",
                self.file_bytes()
            ));
        }
        Ok(())
    }
}
