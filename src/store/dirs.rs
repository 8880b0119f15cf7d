//! The buffer's private sub-directories: one per configured spill directory,
//! named `spillbuffer-<pid>-<random>` so that two buffers never share files
//! and a crashed process's leftovers can be recognised and swept.

use crate::error::{Error, Result};
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

const PREFIX: &str = "spillbuffer-";

/// The sub-directories one buffer owns. Removed with their contents by
/// [`SpillDirs::remove_all`] or on drop.
#[derive(Debug)]
pub(crate) struct SpillDirs {
    paths: Vec<PathBuf>,
}

impl SpillDirs {
    /// Create a fresh private sub-directory in each of `parents` (creating
    /// the parents if needed). Fails naming the first path that cannot be
    /// created; nothing is left behind on failure.
    pub(crate) fn create(parents: &[PathBuf]) -> Result<SpillDirs> {
        let mut made = SpillDirs { paths: Vec::new() };
        let pid = std::process::id();
        for parent in parents {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io("create spill directory", parent.clone(), e))?;
            let path = parent.join(format!("{PREFIX}{pid}-{:016x}", random_id()));
            std::fs::create_dir(&path)
                .map_err(|e| Error::io("create spill directory", path.clone(), e))?;
            made.paths.push(path);
        }
        Ok(made)
    }

    pub(crate) fn path(&self, i: usize) -> &Path {
        &self.paths[i]
    }

    /// The sub-directories, in the order of the configured directories.
    pub(crate) fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// Delete the sub-directories and everything in them.
    pub(crate) fn remove_all(&mut self) {
        for path in self.paths.drain(..) {
            if let Err(e) = std::fs::remove_dir_all(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove spill directory");
                }
            }
        }
    }
}

impl Drop for SpillDirs {
    fn drop(&mut self) {
        self.remove_all();
    }
}

fn random_id() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The owner pid encoded in a sub-directory name, if it is one of ours.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let (pid, id) = rest.split_once('-')?;
    if id.len() != 16 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    pid.parse().ok()
}

/// Is process `pid` alive? Where this cannot be told, say yes: a live
/// process's directory must never be touched.
fn process_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Remove the sub-directories in `parent` left by processes that no longer
/// run. Returns the paths removed. Runs on the IO pool at start-up.
pub(crate) fn sweep_stale(parent: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner_pid) else {
            continue;
        };
        if process_alive(pid) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), pid, "removed stale spill directory");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove stale spill directory")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_only_when_ours() {
        assert_eq!(owner_pid("spillbuffer-42-00000000deadbeef"), Some(42));
        assert_eq!(owner_pid("spillbuffer-42-xyz"), None);
        assert_eq!(owner_pid("other-42-00000000deadbeef"), None);
        assert_eq!(owner_pid("spillbuffer-x-00000000deadbeef"), None);
    }

    #[test]
    fn two_buffers_get_distinct_dirs_removed_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let a = SpillDirs::create(&[tmp.path().to_path_buf()]).unwrap();
        let b = SpillDirs::create(&[tmp.path().to_path_buf()]).unwrap();
        assert_ne!(a.path(0), b.path(0));
        let (pa, pb) = (a.path(0).to_path_buf(), b.path(0).to_path_buf());
        assert!(pa.is_dir() && pb.is_dir());
        drop(a);
        drop(b);
        assert!(!pa.exists() && !pb.exists());
    }

    #[test]
    fn sweep_removes_dead_owners_only() {
        let tmp = tempfile::tempdir().unwrap();
        // A pid far above any pid_max is never alive.
        let dead = tmp.path().join("spillbuffer-4000000000-0123456789abcdef");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join("seg-00000000.spill"), b"x").unwrap();
        let mine = SpillDirs::create(&[tmp.path().to_path_buf()]).unwrap();
        let parent_alive = tmp.path().join(format!(
            "spillbuffer-{}-0123456789abcdef",
            std::os::unix::process::parent_id()
        ));
        std::fs::create_dir(&parent_alive).unwrap();
        let unrelated = tmp.path().join("keep-me");
        std::fs::create_dir(&unrelated).unwrap();

        let removed = sweep_stale(tmp.path());
        assert_eq!(removed, vec![dead.clone()]);
        assert!(!dead.exists());
        assert!(mine.path(0).exists() && parent_alive.exists() && unrelated.exists());
    }

    #[test]
    fn unusable_parent_fails_naming_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let err = SpillDirs::create(&[file.join("sub")]).unwrap_err();
        assert!(err.to_string().contains("a-file"), "{err}");
    }
}
