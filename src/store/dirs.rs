//! The buffer's private sub-directories, and the start-up sweep of the ones
//! crashed processes left behind.
//!
//! Each buffer makes one sub-directory per configured spill directory, named
//! `spillbuffer-<pid>-<16 lowercase hex digits>`, mode 0700 whatever the
//! umask. In it a `lock` file stays locked (`flock`) for as long as the
//! buffer owns the directory. The lock, not the pid, tells a live directory
//! from a leftover: a pid means nothing in another PID namespace or on
//! another host sharing the directory, while a lock is held by whichever
//! process has it, wherever it runs, and is released by the kernel when that
//! process dies. The pid in the name only helps a person reading `ls`.
//!
//! The sweep removes a sub-directory only when all of these hold: its name
//! parses strictly; it is a directory, not a symlink (it is opened with
//! `O_NOFOLLOW`, and the removal never follows a symlink inside it); it
//! belongs to this process's effective uid; no buffer of this process owns
//! it; and its `lock` file (a regular file, not a symlink) can be locked.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

const PREFIX: &str = "spillbuffer-";
/// The lock file held for the directory's life.
const LOCK: &str = "lock";
/// The lock file before it is locked. It is renamed to [`LOCK`] once locked,
/// so a sweeper never finds a `lock` that is not yet held: a sub-directory
/// without one is being created (or its creator died within those few
/// calls; such an empty directory is left alone).
const LOCK_UNHELD: &str = "lock.new";

/// (device, inode) of every sub-directory a buffer of this process owns.
/// The sweep skips these before it opens their lock file: where `flock` is
/// emulated with per-process POSIX locks (NFS), a lock taken again by the
/// owning process would succeed, and closing that second handle would drop
/// the owner's lock.
static OWNED_HERE: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// One sub-directory, its lock held.
#[derive(Debug)]
struct Owned {
    /// Locked until the directory is removed; the lock goes with the handle.
    _lock: File,
    /// (device, inode), listed in [`OWNED_HERE`] while the directory exists.
    id: (u64, u64),
}

/// The sub-directories one buffer owns. Removed with their contents by
/// [`SpillDirs::remove_all`] or on drop.
#[derive(Debug)]
pub(crate) struct SpillDirs {
    paths: Vec<PathBuf>,
    /// One per path, in the same order.
    owned: Vec<Owned>,
}

impl SpillDirs {
    /// Create a fresh private sub-directory in each of `parents` (creating
    /// the parents if needed) and lock it. Fails naming the first path that
    /// cannot be created or locked; nothing is left behind on failure.
    pub(crate) fn create(parents: &[PathBuf]) -> Result<SpillDirs> {
        let mut made = SpillDirs {
            paths: Vec::new(),
            owned: Vec::new(),
        };
        let pid = std::process::id();
        for parent in parents {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io("create spill directory", parent.clone(), e))?;
            let path = parent.join(format!("{PREFIX}{pid}-{:016x}", random_id()));
            let owned = create_locked(&path)?;
            OWNED_HERE.lock().push(owned.id);
            made.paths.push(path);
            made.owned.push(owned);
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

    /// Delete the sub-directories and everything in them. Each lock is
    /// released only after its directory is gone.
    pub(crate) fn remove_all(&mut self) {
        for (path, owned) in self.paths.drain(..).zip(self.owned.drain(..)) {
            if let Err(e) = std::fs::remove_dir_all(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove spill directory");
                }
            }
            OWNED_HERE.lock().retain(|id| *id != owned.id);
        }
    }
}

impl Drop for SpillDirs {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Make `path` (mode 0700) with its lock file locked inside; on failure
/// remove what was made and name the path.
fn create_locked(path: &Path) -> Result<Owned> {
    let made = std::fs::create_dir(path);
    made.map_err(|e| Error::io("create spill directory", path.to_path_buf(), e))?;
    lock_new_dir(path).map_err(|e| {
        let _ = std::fs::remove_dir_all(path);
        Error::io("lock spill directory", path.to_path_buf(), e)
    })
}

#[cfg(unix)]
fn lock_new_dir(path: &Path) -> std::io::Result<Owned> {
    use rustix::fs::{flock, FlockOperation};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    // The umask can only have taken bits away from the mode mkdir was given
    // (0777): set it whole, private and writable by this user.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    let unheld = path.join(LOCK_UNHELD);
    let lock = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&unheld)?;
    // Nobody else has this file open, so only a file system without locks
    // refuses; then the directory could not be told live, so fail.
    flock(&lock, FlockOperation::NonBlockingLockExclusive)?;
    std::fs::rename(&unheld, path.join(LOCK))?;
    let meta = std::fs::symlink_metadata(path)?;
    Ok(Owned {
        _lock: lock,
        id: (meta.dev(), meta.ino()),
    })
}

/// Without `flock` there is no way to tell a live directory from a
/// leftover: the directory is made but never swept.
#[cfg(not(unix))]
fn lock_new_dir(path: &Path) -> std::io::Result<Owned> {
    let lock = std::fs::File::create(path.join(LOCK_UNHELD))?;
    Ok(Owned {
        _lock: lock,
        id: (0, 0),
    })
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

/// Is `name` exactly what [`SpillDirs::create`] makes: the prefix, a pid in
/// plain decimal (no sign, no leading zero, fits a u32), a dash, and 16
/// lowercase hex digits?
fn is_ours(name: &str) -> bool {
    let Some((pid, id)) = name
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once('-'))
    else {
        return false;
    };
    let pid_ok = matches!(pid.as_bytes().first(), Some(b'1'..=b'9'))
        && pid.bytes().all(|b| b.is_ascii_digit())
        && pid.parse::<u32>().is_ok();
    let id_ok = id.len() == 16 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    pid_ok && id_ok
}

/// Remove the sub-directories in `parent` left by buffers that no longer
/// run (see the module docs for what is never touched). Returns the paths
/// removed. Runs on the IO pool at start-up.
pub(crate) fn sweep_stale(parent: &Path) -> Vec<PathBuf> {
    #[cfg(unix)]
    {
        sweep(parent, rustix::process::geteuid().as_raw())
    }
    #[cfg(not(unix))]
    {
        let _ = parent;
        Vec::new()
    }
}

/// [`sweep_stale`] on behalf of `uid`.
#[cfg(unix)]
fn sweep(parent: &Path, uid: u32) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_ours) {
            continue;
        }
        // A cheap first look that does not follow symlinks; `claim` checks
        // again on what it opens.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let lock = match claim(&path, uid) {
            Ok(Some(lock)) => lock,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "left a spill directory alone: could not tell whether it is stale");
                continue;
            }
        };
        // Removing through the path is safe even if it were swapped for a
        // symlink since `claim` looked: std removes a symlink itself, never
        // what it points to, at the top and inside.
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed stale spill directory");
                removed.push(path);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not remove stale spill directory")
            }
        }
        drop(lock);
    }
    removed
}

/// The lock of the sub-directory at `path`, taken, if it is a stale one of
/// `uid`'s; `None` when it must be left alone.
#[cfg(unix)]
fn claim(path: &Path, uid: u32) -> std::io::Result<Option<File>> {
    use rustix::fs::{flock, openat, FlockOperation, Mode, OFlags, CWD};
    use rustix::io::Errno;
    use std::os::unix::fs::MetadataExt;

    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // A symlink fails to open here (ELOOP/ENOTDIR): left alone.
    let dir = match openat(CWD, path, flags | OFlags::DIRECTORY, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let meta = dir.metadata()?;
    let id = (meta.dev(), meta.ino());
    if meta.uid() != uid || OWNED_HERE.lock().contains(&id) {
        return Ok(None);
    }
    // NONBLOCK: a FIFO planted as `lock` must not hang the sweep.
    let lock = match openat(&dir, LOCK, flags | OFlags::NONBLOCK, Mode::empty()) {
        Ok(fd) => File::from(fd),
        // No lock yet (being created), or a symlink: left alone.
        Err(Errno::NOENT | Errno::LOOP) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !lock.metadata()?.is_file() {
        return Ok(None);
    }
    match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    // The name may have been removed or reused since it was opened (another
    // sweeper got there first): only the directory opened may go.
    match std::fs::symlink_metadata(path) {
        Ok(now) if (now.dev(), now.ino()) == id => Ok(Some(lock)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A leftover of a crashed buffer: well named, lock file not held.
    fn leftover(parent: &Path, name: &str) -> PathBuf {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(LOCK), b"").unwrap();
        std::fs::write(dir.join("seg-00000000.spill"), b"x").unwrap();
        dir
    }

    fn my_uid() -> u32 {
        rustix::process::geteuid().as_raw()
    }

    #[test]
    fn names_parse_only_when_exactly_ours() {
        assert!(is_ours("spillbuffer-42-00000000deadbeef"));
        assert!(is_ours("spillbuffer-4294967295-0123456789abcdef"));
        for loose in [
            "spillbuffer-42-xyz",
            "other-42-00000000deadbeef",
            "spillbuffer-x-00000000deadbeef",
            "spillbuffer-+31995-00000000deadbeef",
            "spillbuffer--31995-00000000deadbeef",
            "spillbuffer-031995-00000000deadbeef",
            "spillbuffer-0-00000000deadbeef",
            "spillbuffer-4294967296-00000000deadbeef",
            "spillbuffer- 42-00000000deadbeef",
            "spillbuffer-42-00000000DEADBEEF",
            "spillbuffer-42-00000000deadbee",
            "spillbuffer-42-00000000deadbeef0",
            "spillbuffer-42-+0000000deadbeef",
            "spillbuffer-42-00000000deadbeef.new",
            "spillbuffer-42-0000000-deadbeef",
            "spillbuffer-42",
            "spillbuffer-",
        ] {
            assert!(!is_ours(loose), "{loose} was accepted");
        }
    }

    #[test]
    fn a_new_directory_is_private_and_locked_before_its_lock_has_a_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = SpillDirs::create(&[tmp.path().to_path_buf()]).unwrap();
        let dir = dirs.path(0);
        assert!(is_ours(dir.file_name().unwrap().to_str().unwrap()));
        let mode = std::fs::metadata(dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(!dir.join(LOCK_UNHELD).exists());
        // Another open file description of the lock cannot take it.
        let other = File::open(dir.join(LOCK)).unwrap();
        let taken = rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive);
        assert_eq!(taken, Err(rustix::io::Errno::WOULDBLOCK));
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
    fn sweep_removes_unlocked_leftovers_whatever_their_pid() {
        let tmp = tempfile::tempdir().unwrap();
        // Pid 1 is always running, and this process's own pid too: a pid
        // proves nothing, the free lock does.
        let init = leftover(tmp.path(), "spillbuffer-1-0123456789abcdef");
        let own_pid = leftover(
            tmp.path(),
            &format!("spillbuffer-{}-0123456789abcdef", std::process::id()),
        );
        let mine = SpillDirs::create(&[tmp.path().to_path_buf()]).unwrap();
        let unrelated = tmp.path().join("keep-me");
        std::fs::create_dir(&unrelated).unwrap();

        let mut removed = sweep(tmp.path(), my_uid());
        removed.sort();
        let mut expected = vec![init.clone(), own_pid.clone()];
        expected.sort();
        assert_eq!(removed, expected);
        assert!(!init.exists() && !own_pid.exists());
        assert!(mine.path(0).join(LOCK).exists() && unrelated.exists());
    }

    #[test]
    fn sweep_leaves_another_users_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = leftover(tmp.path(), "spillbuffer-7-0123456789abcdef");
        assert!(sweep(tmp.path(), my_uid().wrapping_add(1)).is_empty());
        assert!(dir.join(LOCK).exists());
    }

    /// Where locks are per process (NFS emulates `flock` with POSIX locks),
    /// the sweep could take the lock of this process's own directory; the
    /// list of directories owned here must stop it before it tries.
    #[test]
    fn sweep_never_takes_a_directory_of_this_process_even_unlocked() {
        let tmp = tempfile::tempdir().unwrap();
        let mine = SpillDirs::create(&[tmp.path().to_path_buf()]).unwrap();
        rustix::fs::flock(&mine.owned[0]._lock, rustix::fs::FlockOperation::Unlock).unwrap();
        assert!(sweep(tmp.path(), my_uid()).is_empty());
        assert!(mine.path(0).join(LOCK).exists());
    }

    #[test]
    fn a_directory_without_a_lock_file_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = leftover(tmp.path(), "spillbuffer-7-0123456789abcdef");
        std::fs::rename(dir.join(LOCK), dir.join(LOCK_UNHELD)).unwrap();
        assert!(sweep(tmp.path(), my_uid()).is_empty());
        assert!(dir.join(LOCK_UNHELD).exists());
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
