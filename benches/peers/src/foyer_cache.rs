//! foyer's hybrid cache set up to lose nothing a workload inserts: every
//! value written to disk on insertion (`HybridCachePolicy::WriteOnInsertion`),
//! a device large enough that no block is reclaimed, and, in the lossless
//! mode, a wait after each insert for foyer's flushers to have written it.
//! foyer has no per-entry write acknowledgement: `Store::wait` waits for
//! everything queued so far to reach the device, which after one insert
//! is that insert. Without the waits, foyer drops entries once its submit
//! queue passes its threshold, as a cache may; the bench counts them.

use foyer::{
    BlockEngineConfig, Code, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    HybridCachePolicy,
};
use std::io::{Read, Write};
use std::path::Path;

/// A value of the workloads: foyer's `Code` is foreign, as is `Vec<f64>`.
pub struct Val(pub Vec<f64>);

impl Code for Val {
    fn encode(&self, writer: &mut impl Write) -> foyer::Result<()> {
        writer
            .write_all(&(self.0.len() as u64).to_le_bytes())
            .map_err(foyer::Error::io_error)?;
        writer
            .write_all(bytemuck::cast_slice(&self.0))
            .map_err(foyer::Error::io_error)
    }

    fn decode(reader: &mut impl Read) -> foyer::Result<Self> {
        let mut len = [0u8; 8];
        reader
            .read_exact(&mut len)
            .map_err(foyer::Error::io_error)?;
        let mut v = vec![0f64; u64::from_le_bytes(len) as usize];
        reader
            .read_exact(bytemuck::cast_slice_mut(&mut v))
            .map_err(foyer::Error::io_error)?;
        Ok(Val(v))
    }

    fn estimated_size(&self) -> usize {
        8 + self.0.len() * 8
    }
}

pub type Cache = HybridCache<u64, Val>;

/// A hybrid cache with `memory` bytes of memory (values weighed by their
/// bytes, one shard so that the budget is one, as the buffer's is) over a
/// file device of `disk` bytes in `dir`. Call inside a tokio runtime:
/// foyer's flushers and IO run on it.
pub async fn build(dir: &Path, memory: usize, disk: usize) -> foyer::Result<Cache> {
    let device = FsDeviceBuilder::new(dir).with_capacity(disk).build()?;
    HybridCacheBuilder::new()
        .with_policy(HybridCachePolicy::WriteOnInsertion)
        .memory(memory)
        .with_shards(1)
        .with_weighter(|_: &u64, v: &Val| v.0.len() * 8)
        .storage()
        .with_engine_config(BlockEngineConfig::new(device))
        .build()
        .await
}

/// Insert, and in the lossless mode wait until foyer has written the value.
pub async fn insert(cache: &Cache, key: u64, value: Vec<f64>, wait: bool) {
    drop(cache.insert(key, Val(value)));
    if wait {
        cache.storage().wait().await;
    }
}

/// Keys of `0..count` that no longer read back: what foyer dropped.
pub async fn lost(cache: &Cache, count: usize) -> usize {
    let mut lost = 0;
    for k in 0..count as u64 {
        if !matches!(cache.get(&k).await, Ok(Some(_))) {
            lost += 1;
        }
    }
    lost
}
