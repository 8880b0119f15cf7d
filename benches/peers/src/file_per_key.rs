//! A file-per-key store, as Dask's `zict.File` keeps spilled values: one
//! file per key in a directory, opened, written whole and closed on each
//! put (no fsync), read whole on each get. In front of it, the budget a
//! `zict.Buffer` keeps: values stay in memory in least-recently-inserted
//! order until their bytes pass the target, and the oldest are written
//! out on the caller's thread.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The directory of files, one per key.
pub struct FilePerKey {
    dir: PathBuf,
}

impl FilePerKey {
    /// A store in `dir`, which must exist and be empty.
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.into() }
    }

    fn path(&self, key: u64) -> PathBuf {
        self.dir.join(key.to_string())
    }

    /// Write `value` to the key's own file.
    pub fn put(&self, key: u64, value: &[f64]) -> std::io::Result<()> {
        let path = self.path(key);
        let mut f = File::create(&path)?;
        f.write_all(bytemuck::cast_slice(value))
    }

    /// Read the key's whole file back into a new value.
    pub fn get(&self, key: u64) -> std::io::Result<Vec<f64>> {
        let mut f = File::open(self.path(key))?;
        let len = f.metadata()?.len() as usize;
        let mut value = vec![0f64; len / 8];
        f.read_exact(bytemuck::cast_slice_mut(&mut value))?;
        Ok(value)
    }
}

/// The memory budget in front of the files: values in insertion order,
/// the oldest written to their files while the bytes held pass `target`.
pub struct Budget {
    files: FilePerKey,
    target: usize,
    resident: VecDeque<(u64, Vec<f64>)>,
    resident_bytes: usize,
    /// Values written to files so far.
    pub written: usize,
}

impl Budget {
    /// An empty budget of `target` bytes over `files`.
    pub fn new(files: FilePerKey, target: usize) -> Self {
        Self {
            files,
            target,
            resident: VecDeque::new(),
            resident_bytes: 0,
            written: 0,
        }
    }

    /// Hold `value`, then write the oldest values out until the bytes
    /// held are within the target.
    pub fn insert(&mut self, key: u64, value: Vec<f64>) -> std::io::Result<()> {
        self.resident_bytes += value.len() * 8;
        self.resident.push_back((key, value));
        while self.resident_bytes > self.target {
            let Some((k, v)) = self.resident.pop_front() else {
                break;
            };
            self.files.put(k, &v)?;
            self.resident_bytes -= v.len() * 8;
            self.written += 1;
        }
        Ok(())
    }
}
