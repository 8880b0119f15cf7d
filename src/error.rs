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
    /// A record read back from disk failed its checksum or could not be decoded.
    Corrupt {
        /// The key whose record is damaged (`Debug` form).
        key: String,
        /// The segment file holding the record.
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
            _ => None,
        }
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
