//! The crate's one error type. Every variant names what it is about (the key,
//! the file or the setting) so a log line alone says where to look.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// The error type a [`crate::Spill`] implementation returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A shared, cloneable error source: one failed read may be reported to
/// every reader that waited on it.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in spillbuffer.
///
/// Errors are `Clone` because several readers of one spilled key share one
/// disk read, and each of them receives its outcome.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A file-system operation failed.
    Io {
        /// What was being done, e.g. "create spill directory".
        op: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// A record read back from disk failed its checksum or could not be
    /// decoded, or a received transfer failed its checks.
    Corrupt {
        /// The key whose record is damaged (`Debug` form).
        key: String,
        /// The segment file holding the record; `(received transfer)` for
        /// a record refused by `SpillBuffer::insert_record` before it was
        /// written.
        path: PathBuf,
        /// What was wrong with it.
        detail: String,
    },
    /// [`crate::Spill::encode`] failed for a value.
    Encode {
        /// The key of the value (`Debug` form).
        key: String,
        /// The error `encode` returned.
        source: SharedError,
    },
    /// Decoding a value failed. The buffer itself reports a record whose
    /// bytes pass their checksum but fail [`crate::Spill::decode`] as
    /// [`Error::Corrupt`] (with the decode error in `detail`), since the
    /// value cannot be had either way; this variant is for hosts wrapping
    /// their own codecs in this error type.
    Decode {
        /// The key of the value (`Debug` form).
        key: String,
        /// The error `decode` returned.
        source: SharedError,
    },
    /// A write found no space left on the file system holding the spill
    /// directory (ENOSPC, or the user's disk quota, EDQUOT). The value
    /// stays in memory; spilling resumes by itself once space comes back
    /// (keys removed, or space freed on the file system).
    DiskFull {
        /// The segment file (or directory) that could not grow.
        path: PathBuf,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// Writing a record would pass the disk budget set by `max_spill`.
    DiskBudget {
        /// The budget, in bytes.
        budget: u64,
        /// Bytes of live records on disk when the write was refused.
        used: u64,
        /// Size of the record that was refused.
        record: u64,
    },
    /// Memory is over `memory_limit` and nothing can be spilled to bring it
    /// down: [`crate::SpillBuffer::insert_async`] refused a value (see
    /// [`InsertError`]). `cause` is the spill failure that stands in the way.
    MemoryLimit {
        /// Bytes of values held in memory when the value was refused.
        memory: u64,
        /// The `memory_limit` setting.
        limit: u64,
        /// Why nothing can be spilled: [`Error::Io`] (disk full, naming the
        /// file and so the directory; or another I/O error),
        /// [`Error::DiskBudget`] (`max_spill` reached) or [`Error::Encode`]
        /// (values whose encode failed, naming the last key).
        cause: Box<Error>,
    },
    /// A builder setting is out of range.
    Config {
        /// The setting's name, as on the builder.
        setting: &'static str,
        /// Why it was refused.
        detail: String,
    },
    /// The buffer's IO pool has shut down (the buffer is being dropped).
    Closed,
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }

    /// Like [`Error::io`], but a full file system (ENOSPC, EDQUOT) becomes
    /// [`Error::DiskFull`], so that hosts and the buffer can tell it from a
    /// broken disk.
    pub(crate) fn write(
        op: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        if is_no_space(&source) {
            Error::DiskFull {
                path: path.into(),
                source: Arc::new(source),
            }
        } else {
            Error::io(op, path, source)
        }
    }

    /// True for an error that says the disk is full (no space left, or a
    /// quota exceeded), here or as the cause of an [`Error::MemoryLimit`].
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::DiskFull { .. } => true,
            Error::Io { source, .. } => is_no_space(source),
            Error::MemoryLimit { cause, .. } => cause.is_disk_full(),
            _ => false,
        }
    }

    /// The spill failure behind an [`Error::MemoryLimit`]; the error itself
    /// otherwise.
    pub fn cause(&self) -> &Error {
        match self {
            Error::MemoryLimit { cause, .. } => cause,
            e => e,
        }
    }

    /// True for errors that come from the disk rather than from the data
    /// (`Io`, `DiskFull`): the operation may succeed if retried after the
    /// fault clears.
    pub fn is_io(&self) -> bool {
        matches!(self, Error::Io { .. } | Error::DiskFull { .. })
    }
}

/// Is `e` "no space left on device" or "disk quota exceeded"?
pub(crate) fn is_no_space(e: &std::io::Error) -> bool {
    // std maps ENOSPC to `StorageFull` and EDQUOT to `QuotaExceeded`.
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { op, path, source } => {
                write!(f, "{op} failed for {}: {source}", path.display())
            }
            Error::Corrupt { key, path, detail } => write!(
                f,
                "corrupt record for key {key} in {}: {detail}",
                path.display()
            ),
            Error::Encode { key, source } => write!(f, "encoding key {key} failed: {source}"),
            Error::Decode { key, source } => write!(f, "decoding key {key} failed: {source}"),
            Error::DiskFull { path, source } => {
                write!(f, "no space left to write {}: {source}", path.display())
            }
            Error::DiskBudget {
                budget,
                used,
                record,
            } => write!(
                f,
                "disk budget reached: a {record}-byte record would pass max_spill = {budget} bytes ({used} in use)"
            ),
            Error::MemoryLimit {
                memory,
                limit,
                cause,
            } => write!(
                f,
                "memory is over memory_limit ({memory} bytes held, limit {limit}) and nothing can be spilled: {cause}"
            ),
            Error::Config { setting, detail } => write!(f, "invalid setting {setting}: {detail}"),
            Error::Closed => write!(f, "the spill buffer is shutting down"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } | Error::DiskFull { source, .. } => Some(&**source),
            Error::Encode { source, .. } | Error::Decode { source, .. } => Some(&**source),
            Error::MemoryLimit { cause, .. } => Some(&**cause),
            _ => None,
        }
    }
}

/// A value [`crate::SpillBuffer::insert_async`] refused, handed back with
/// its key: memory is over `memory_limit` and nothing can be spilled.
/// The buffer is as it was before the call (an older value of the key, if
/// any, is still there); nothing is lost. The host can pause (retry later),
/// shed the value, or fix the cause (free disk space, remove keys).
///
/// `error` is an [`Error::MemoryLimit`] whose `cause` says why nothing can
/// be spilled. With `?` it converts into that [`Error`] (the value is then
/// dropped); [`InsertError::into_inner`] gives the key and value back.
pub struct InsertError<K, V> {
    /// The key of the refused value.
    pub key: K,
    /// The refused value, untouched.
    pub value: V,
    /// Why: an [`Error::MemoryLimit`] naming the spill failure.
    pub error: Error,
}

impl<K, V> InsertError<K, V> {
    /// The key and the value, to retry or shed.
    pub fn into_inner(self) -> (K, V) {
        (self.key, self.value)
    }

    /// The spill failure that stands in the way: disk full or another I/O
    /// error ([`Error::Io`]), `max_spill` reached ([`Error::DiskBudget`]),
    /// or values whose encode failed ([`Error::Encode`]).
    pub fn cause(&self) -> &Error {
        self.error.cause()
    }
}

impl<K: fmt::Debug, V> fmt::Debug for InsertError<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InsertError")
            .field("key", &self.key)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<K: fmt::Debug, V> fmt::Display for InsertError<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {:?} not inserted: {}", self.key, self.error)
    }
}

impl<K: fmt::Debug, V> std::error::Error for InsertError<K, V> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<K, V> From<InsertError<K, V>> for Error {
    fn from(e: InsertError<K, V>) -> Error {
        e.error
    }
}

/// A spill that failed, as [`crate::SpillBuffer::last_spill_error`]
/// reports it: the key whose value stayed in memory, and why.
#[derive(Debug, Clone)]
pub struct SpillFailure<K> {
    /// The key whose value could not be written (it stayed in memory).
    pub key: K,
    /// [`Error::Encode`] (the value's encode failed: it is set aside),
    /// [`Error::DiskBudget`] (`max_spill` reached) or [`Error::Io`] (disk
    /// full or another I/O error, naming the file).
    pub error: Error,
}

impl<K: fmt::Debug> fmt::Display for SpillFailure<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spill of key {:?} failed: {}", self.key, self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn io_error_names_path_and_keeps_source() {
        let e = Error::io(
            "create spill directory",
            "/no/such",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        let text = e.to_string();
        assert!(text.contains("/no/such"), "{text}");
        assert!(text.contains("create spill directory"), "{text}");
        assert!(e.source().is_some());
        assert!(e.is_io());
    }

    #[test]
    fn memory_limit_names_its_cause_and_insert_error_gives_the_value_back() {
        let full = Error::io(
            "write record",
            "/spill/spillbuffer-1-00000000000000aa/seg-3",
            std::io::Error::from_raw_os_error(28),
        );
        assert!(full.is_disk_full());
        let e = InsertError {
            key: 7u64,
            value: vec![1u8, 2, 3],
            error: Error::MemoryLimit {
                memory: 9000,
                limit: 8000,
                cause: Box::new(full),
            },
        };
        let text = e.to_string();
        assert!(text.contains("key 7 not inserted"), "{text}");
        assert!(text.contains("memory_limit"), "{text}");
        assert!(text.contains("spillbuffer-1-00000000000000aa"), "{text}");
        assert!(e.cause().is_disk_full() && e.error.is_disk_full());
        let source = e.source().and_then(|s| s.source()).map(|s| s.to_string());
        assert!(source.is_some_and(|s| s.contains("seg-3")));
        let debug = format!("{e:?}");
        assert!(
            debug.contains("key: 7") && !debug.contains("[1, 2, 3]"),
            "{debug}"
        );
        assert_eq!(e.into_inner(), (7, vec![1, 2, 3]));
        let budget = Error::DiskBudget {
            budget: 1000,
            used: 0,
            record: 4155,
        };
        assert!(!budget.is_disk_full());
        assert!(matches!(budget.cause(), Error::DiskBudget { .. }));
    }

    #[test]
    fn no_space_is_told_apart_from_other_write_errors() {
        let full = Error::write(
            "write record",
            "/spill/seg-1",
            std::io::Error::from_raw_os_error(28),
        );
        assert!(matches!(full, Error::DiskFull { .. }), "{full:?}");
        assert!(full.is_io() && full.source().is_some());
        assert!(full.to_string().contains("/spill/seg-1"), "{full}");
        let other = Error::write(
            "write record",
            "/spill/seg-1",
            std::io::Error::other("bad sector"),
        );
        assert!(matches!(other, Error::Io { .. }), "{other:?}");
    }

    #[test]
    fn corrupt_names_key_and_file() {
        let e = Error::Corrupt {
            key: "\"k1\"".into(),
            path: "/tmp/seg-1".into(),
            detail: "checksum mismatch".into(),
        };
        let text = e.to_string();
        assert!(text.contains("k1") && text.contains("/tmp/seg-1"), "{text}");
        assert!(!e.is_io());
    }
}
