//! [`Core`]: the Rust buffer as seen from Python. The `MutableMapping`
//! around it (`spillbuffer.SpillBuffer`) adds weights, serialization and
//! metrics in Python; this type holds the keys and values.
//!
//! # The GIL and the locks
//!
//! The buffer's IO threads take the GIL inside the crate: to serialize a
//! value (`PyValue::encode`) and to drop one (`PyValue`'s `Drop`), and the
//! crate may do either while it holds one of its own locks (it drops
//! values evicted clean while holding its eviction lock, for one). A thread
//! that waited for such a lock while holding the GIL would wait for ever:
//! the holder waits for the GIL. So, by construction:
//!
//! 1. **No call into the crate with the GIL held where a holder may wait
//!    for the GIL.** Every method of the Rust buffer, and every drop of a
//!    [`Pinned`] or of a buffer handle (which may unpin, evict, or join
//!    the IO threads), runs inside [`Core::with_buffer`] or [`release`],
//!    that is under `Python::allow_threads`, with one kind of exception:
//!    the index queries `key_info`, `stored_key` and `with_resident`,
//!    which take one shard lock of the crate in read mode and nothing
//!    else. The crate holds a shard lock only for index work: it encodes,
//!    drops and writes values (what takes the GIL) after releasing it,
//!    and waits for no other lock under it but a leaf of its own. Those
//!    queries are what the hit path (`core[key]`) and the residency
//!    checks make, so they run with the GIL held, without giving it up
//!    and waiting to get it back. Nothing they run under the shard lock
//!    runs Python code: `with_resident`'s closure takes a new reference
//!    to an object, or reads a flag.
//! 2. **The binding's own locks are leaves.** `buf` (in read mode but for
//!    `close`), `manual_pending`, `io_seen`, `Held::pins` and
//!    [`Hooks::errors`] are held only for a map or vector operation, or
//!    for one of the index queries of rule 1: never across another call
//!    into the crate, a wait for the GIL, Python code, or the drop of a
//!    value. Taking one with or without the GIL cannot close a cycle.
//!
//! Together: a thread holding the GIL waits for no lock whose holder can
//! wait for the GIL. (Waiting for the GIL while holding a crate lock, as
//! IO threads do, is then harmless.) `tests/test_deadlock.py` runs mixed
//! operations from several threads under a watchdog.
//!
//! # One index
//!
//! The binding keeps no map of its own: what it asks of a key (its
//! weight, whether its value is in memory, the form first inserted) the
//! crate's index answers, and the total weight of the values not in
//! memory is the crate's `spilled_weight_bytes` gauge.

use crate::key::PyKey;
use crate::record::RecordBytes;
use crate::stored;
use crate::value::{Hooks, PyValue};
use crate::wait::block_on;
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyKeyError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use spillbuffer::{Compression, Error, Pinned, Spill, SpillBuffer, Stats};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Buffer = SpillBuffer<PyKey, PyValue>;

/// The native half of `spillbuffer.SpillBuffer`.
///
/// Every lock here is a leaf (see the module docs): held for a map or
/// vector operation only, never across a call into the crate, a wait for
/// the GIL or Python code.
#[pyclass(module = "spillbuffer._native", frozen)]
pub struct Core {
    /// `None` once closed. (Leaf: read to clone a handle or for an index
    /// query, written to take it out.)
    buf: RwLock<Option<Buffer>>,
    hooks: Arc<Hooks>,
    /// What `core[key]` gives for anything but a memory hit.
    miss: PyObject,
    deserialize_nanos: AtomicU64,
    /// Memory hits served by `core[key]`, and their weight.
    hit_count: AtomicU64,
    /// See `hit_count`.
    hit_bytes: AtomicU64,
    /// Records read from disk for peers ([`Core::for_peer`]), and their
    /// bytes as stored.
    peer_disk_count: AtomicU64,
    /// See `peer_disk_count`.
    peer_disk_bytes: AtomicU64,
    /// Values sent to peers from their record in memory (read back, never
    /// deserialized).
    peer_memory_count: AtomicU64,
    /// After a manual eviction queued a write: the count of landed writes
    /// (done or failed) to reach before the next one. (Leaf.)
    manual_pending: Mutex<Option<u64>>,
    /// The IO figures the mapping last reported ([`Core::io_moved`]).
    /// (Leaf.)
    io_seen: Mutex<IoFigures>,
}

/// What changes when the IO pool has done work the mapping reports to
/// distributed's meters: writes and reads landed or failed, their bytes
/// and time, serialization and deserialization time.
type IoFigures = [u64; 9];

/// [`Core::set`]'s answer: values failed to serialize, to report.
const SET_ERRORS: u8 = 1;
/// [`Core::set`]'s answer: IO figures moved, to report.
const SET_IO_MOVED: u8 = 2;

/// Drop `t` with the GIL released: a [`Pinned`] or a buffer handle, whose
/// drop may take the crate's locks (rule 1 of the module docs).
fn release<T: Send>(py: Python<'_>, t: T) {
    py.allow_threads(move || drop(t));
}

fn to_py_err(e: Error) -> PyErr {
    match e {
        Error::Io { .. } => PyOSError::new_err(e.to_string()),
        Error::Config { .. } => PyValueError::new_err(e.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

impl Core {
    fn buffer(&self) -> PyResult<Buffer> {
        self.buf
            .read()
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("this SpillBuffer is closed"))
    }

    /// Run `f` on the buffer with the GIL released, and let go of the
    /// handle there too (rule 1 of the module docs).
    fn with_buffer<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Buffer) -> T + Send,
    ) -> PyResult<T> {
        let buf = self.buffer()?;
        Ok(py.allow_threads(move || f(&buf)))
    }

    /// An index query (rule 1 of the module docs: one shard lock in read
    /// mode), made with the GIL held, on the open buffer.
    fn query<T>(&self, f: impl FnOnce(&Buffer) -> T) -> PyResult<T> {
        match &*self.buf.read() {
            Some(buf) => Ok(f(buf)),
            None => Err(PyRuntimeError::new_err("this SpillBuffer is closed")),
        }
    }

    /// The Python object of a pinned value: the inserted object, or the one
    /// deserialized by `loads` from the frames of a record read back.
    /// Also says whether this call deserialized it.
    fn object_of(
        &self,
        py: Python<'_>,
        key: &PyKey,
        value: &PyValue,
        loads: &Bound<'_, PyAny>,
    ) -> PyResult<(PyObject, bool)> {
        if let Some(obj) = value.object(py) {
            return Ok((obj, false));
        }
        let rec = value
            .record()
            .ok_or_else(|| PyRuntimeError::new_err("value without an object or a record"))?;
        let frames = stored::frames_of(py, key, rec)?;
        let start = Instant::now();
        let obj = loads.call1((PyList::new(py, frames)?,))?;
        self.deserialize_nanos
            .fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
        Ok((value.set_object(py, obj.unbind()), true))
    }

    /// Have the IO figures the mapping reports moved since the last call?
    /// (With the GIL released: it reads the buffer's stats.)
    fn io_moved(&self, buf: &Buffer) -> bool {
        let s = buf.stats();
        let now: IoFigures = [
            s.spill_count_total,
            s.spill_errors_total,
            s.spilled_bytes_total,
            s.unspill_count_total,
            s.unspilled_bytes_total,
            s.spill_seconds_total.to_bits(),
            s.unspill_seconds_total.to_bits(),
            self.hooks.serialize_nanos.load(Relaxed),
            self.deserialize_nanos.load(Relaxed),
        ];
        let mut seen = self.io_seen.lock();
        let moved = *seen != now;
        *seen = now;
        moved
    }

    /// [`Core::evict_one`], with the GIL released: the weight evicted
    /// (counted up to what `cap` still allows), or `None` for the -1 the
    /// protocol asks.
    fn evict_one_unlocked(&self, buf: &Buffer, cap: u64, wait_s: f64, heavy: u64) -> Option<i64> {
        let landed = |s: &Stats| s.spill_count_total + s.spill_errors_total;
        let pending = *self.manual_pending.lock();
        if let Some(threshold) = pending {
            if landed(&buf.stats()) < threshold {
                return None;
            }
            // (Another thread may have set a new one meanwhile: keep it.)
            let mut pending = self.manual_pending.lock();
            if *pending == Some(threshold) {
                *pending = None;
            }
        }
        let before = buf.stats();
        if before.spilling_bytes >= cap {
            return None;
        }
        let w = buf.evict(1);
        if w == 0 {
            return None;
        }
        // What the monitor counts: no more than it may still put in flight,
        // so that it never totals more than it needed while memory has not
        // fallen yet (it would then run the garbage collector on the loop).
        let counted = (w as u64).min(cap - before.spilling_bytes) as i64;
        // A clean eviction freed its memory at once; a dirty one queued a
        // write. Writes land in queue order, so the next one landing is
        // this one or one before it.
        if buf.stats().clean_evictions_total == before.clean_evictions_total {
            let threshold = landed(&before) + 1;
            let wait = Duration::from_secs_f64(wait_s.max(0.0));
            let deadline = Instant::now() + wait;
            let done = loop {
                if landed(&buf.stats()) >= threshold {
                    break true;
                }
                if Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_micros(50));
            };
            if !done {
                if w as u64 >= heavy {
                    // A heavy value takes its time to write: it counts
                    // towards `cap` while in flight, and the monitor goes
                    // on evicting until the writes under way cover it.
                    return Some(counted);
                }
                // A light one that has not landed (a slow serializer, a
                // busy machine): memory has not fallen yet. -1 ends the
                // monitor's round here; it looks again at its next tick.
                *self.manual_pending.lock() = Some(threshold);
                return None;
            } else if buf.stats().spill_errors_total > before.spill_errors_total {
                // It failed (the value stays in memory, the error is
                // reported): tell the monitor, which then stops trying.
                return None;
            }
        }
        Some(counted)
    }
}

#[pymethods]
impl Core {
    /// Build the buffer; `dumps` serializes a value into a list of frames
    /// (failures are kept for `take_errors`); `miss` is what `core[key]`
    /// gives for anything but a memory hit.
    #[new]
    #[pyo3(signature = (directory, target, limit, max_spill, compression, io_threads, dumps, miss))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        directory: PathBuf,
        target: usize,
        limit: Option<usize>,
        max_spill: Option<u64>,
        compression: &str,
        io_threads: usize,
        dumps: PyObject,
        miss: PyObject,
    ) -> PyResult<Self> {
        let compression = match compression {
            "lz4" => Compression::Lz4,
            "none" => Compression::None,
            other => {
                return Err(PyValueError::new_err(format!(
                    "compression must be 'lz4' or None, not {other:?}"
                )))
            }
        };
        let mut b = Buffer::builder(directory)
            .memory_target(target)
            .compression(compression)
            .io_threads(io_threads);
        if let Some(limit) = limit {
            b = b.memory_limit(limit);
        }
        if let Some(max) = max_spill {
            b = b.max_spill(max);
        }
        let buf = py.allow_threads(|| b.build()).map_err(to_py_err)?;
        Ok(Core {
            buf: RwLock::new(Some(buf)),
            hooks: Arc::new(Hooks {
                dumps,
                serialize_nanos: AtomicU64::new(0),
                fresh_encodes: AtomicU64::new(0),
                fresh_bytes: AtomicU64::new(0),
                errors: Mutex::new(Vec::new()),
                has_errors: AtomicBool::new(false),
            }),
            miss,
            deserialize_nanos: AtomicU64::new(0),
            hit_count: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
            peer_disk_count: AtomicU64::new(0),
            peer_disk_bytes: AtomicU64::new(0),
            peer_memory_count: AtomicU64::new(0),
            manual_pending: Mutex::new(None),
            io_seen: Mutex::new(IoFigures::default()),
        })
    }

    /// Insert, then wait (GIL released) while the values the buffer holds
    /// pass its memory limit and writes in flight will bring them down:
    /// the crate's `insert_async`, run on this thread. A producer faster
    /// than the disk is held at the limit instead of filling memory with
    /// values waiting to be written. When spilling is failing (disk full,
    /// `max_spill` reached, values that fail to serialize) memory cannot
    /// fall: the value is then kept in memory without waiting, as
    /// distributed's own mapping keeps what it cannot spill.
    ///
    /// Returns flags for the mapping: 1 if values failed to serialize
    /// (`take_errors`), 2 if the IO figures moved since this or
    /// [`Core::io_moved`] last looked (to report to distributed's meters).
    fn set(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: PyObject,
        weight: usize,
    ) -> PyResult<u8> {
        let k = PyKey::from_py(key)?;
        let hooks = Arc::clone(&self.hooks);
        // (A replaced value may be dropped in the call, taking the GIL.)
        let moved = self
            .with_buffer(py, move |buf| {
                // As a dict does, replacing a value keeps the key first
                // inserted (`1` stays `1` when `1.0` is assigned to).
                let k = buf.stored_key(&k).unwrap_or(k);
                let v = PyValue::new(k.clone(), value, weight, hooks);
                match block_on(buf.insert_async(k, v)) {
                    Ok(()) => Ok(()),
                    Err(refused) => {
                        let (k, v) = refused.into_inner();
                        buf.insert(k, v)
                    }
                }
                .map(|()| self.io_moved(buf))
            })?
            .map_err(to_py_err)?;
        let errors = self.hooks.has_errors.load(Relaxed);
        Ok(if errors { SET_ERRORS } else { 0 } | if moved { SET_IO_MOVED } else { 0 })
    }

    /// Have the IO figures moved since this or `set` last looked?
    #[pyo3(name = "io_moved")]
    fn py_io_moved(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_buffer(py, |buf| self.io_moved(buf))
    }

    /// The value of `key`: from memory, or read back from disk with the GIL
    /// released (joining a read already in flight). Returns the object, its
    /// weight, whether it had to wait for a disk read, and whether it was
    /// deserialized by this call.
    fn get(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        loads: &Bound<'_, PyAny>,
    ) -> PyResult<(PyObject, usize, bool, bool)> {
        let buf = self.buffer()?;
        let k = PyKey::from_py(key)?;
        // A memory hit, else a read from disk (joining one in flight).
        let (pinned, waited) = py.allow_threads(|| match buf.try_pin(&k) {
            Some(p) => (Ok(Some(p)), false),
            None => (buf.get(&k), true),
        });
        let pinned = match pinned {
            Ok(Some(p)) => p,
            Ok(None) => {
                release(py, buf);
                return Err(PyKeyError::new_err(key.clone().unbind()));
            }
            Err(e) => {
                release(py, buf);
                return Err(to_py_err(e));
            }
        };
        let obj = self.object_of(py, &k, &pinned, loads);
        let weight = pinned.weight();
        release(py, (pinned, buf));
        let (obj, deserialized) = obj?;
        Ok((obj, weight, waited, deserialized))
    }

    /// `core[key]`: a memory hit of a value held as an object gives the
    /// object, anything else the `miss` object given to the constructor
    /// (on disk, read back but not deserialized, absent, or a key of an
    /// unsupported type: `get` then does the rest and raises what it
    /// must). The hits and their weight are counted for the mapping's
    /// `memory-read` figures ([`Core::hits`]). A subscript rather than a
    /// method: under the stable ABI of Python 3.9 a method call builds a
    /// tuple of its arguments, a subscript passes the key as it is.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let miss = || self.miss.clone_ref(py);
        let Ok(k) = PyKey::from_py(key) else {
            return Ok(miss());
        };
        // With the GIL held (rule 1 of the module docs): a new reference
        // to the object, taken under the shard's read lock; no pin.
        let found =
            self.query(|buf| buf.with_resident(&k, |v| v.object(py).map(|o| (o, v.weight()))))?;
        Ok(match found.flatten() {
            Some((obj, weight)) => {
                self.hit_count.fetch_add(1, Relaxed);
                self.hit_bytes.fetch_add(weight as u64, Relaxed);
                obj
            }
            None => miss(),
        })
    }

    /// The hits `core[key]` served, and their weight.
    fn hits(&self) -> (u64, u64) {
        (self.hit_count.load(Relaxed), self.hit_bytes.load(Relaxed))
    }

    fn contains(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = PyKey::from_py(key)?;
        self.with_buffer(py, |buf| buf.contains_key(&k))
    }

    /// Remove; `KeyError` if absent.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let k = PyKey::from_py(key)?;
        let buf = self.buffer()?;
        // (The value may be dropped in the call, taking the GIL.)
        let removed = py.allow_threads(|| {
            let removed = buf.remove(&k);
            drop(buf);
            removed
        });
        if removed {
            Ok(())
        } else {
            Err(PyKeyError::new_err(key.clone().unbind()))
        }
    }

    /// The live keys, as Python objects; nothing is read back.
    fn keys(&self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        let keys = self.with_buffer(py, |buf| buf.keys())?;
        keys.iter().map(|k| k.to_py(py)).collect()
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.with_buffer(py, |buf| buf.len())
    }

    /// Is `key`'s value in memory (resident, or being written)? From the
    /// index, with the GIL held; not a use of the key.
    fn resident(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = PyKey::from_py(key)?;
        self.query(|buf| buf.key_info(&k).is_some_and(|i| i.resident))
    }

    /// Is `key`'s value in memory as a Python object (inserted, or read
    /// back and deserialized since), so that a peer is sent it as it is?
    /// With the GIL held; a use of the key, as the peer's read is.
    fn object_in_memory(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = PyKey::from_py(key)?;
        self.query(|buf| buf.with_resident(&k, |v| v.has_object()) == Some(true))
    }

    /// Keys whose values are (`true`) or are not (`false`) in memory.
    fn keys_where_resident(&self, py: Python<'_>, resident: bool) -> PyResult<Vec<PyObject>> {
        let keys = self.with_buffer(py, |buf| {
            if resident {
                buf.resident_keys()
            } else {
                buf.spilled_keys()
            }
        })?;
        keys.iter().map(|k| k.to_py(py)).collect()
    }

    /// The memory monitor's eviction: evict the least recently used value
    /// and return its weight (counted up to what `cap` still allows), or
    /// -1 if nothing was evicted.
    ///
    /// A monitor evicts, re-reads process memory and evicts again while it
    /// is high; memory only falls once a write lands. So:
    ///
    /// - while `cap` bytes or more are being written, this evicts nothing:
    ///   the writes under way will bring memory down (the mapping passes
    ///   what process memory is over the monitor's target as `cap`);
    /// - after queuing the write of a value lighter than `heavy`, it waits
    ///   up to `wait_s` (GIL released) for it to land, which a small write
    ///   does well within that; one that has not landed returns -1 and
    ///   holds further evictions until it has;
    /// - a value of `heavy` bytes or more is not waited for past `wait_s`:
    ///   it counts as leaving memory, and the monitor goes on.
    ///
    /// A write seen failing within the wait also returns -1, as the
    /// protocol asks.
    fn evict_one(&self, py: Python<'_>, cap: u64, wait_s: f64, heavy: u64) -> PyResult<i64> {
        self.with_buffer(py, |buf| self.evict_one_unlocked(buf, cap, wait_s, heavy))
            .map(|w| w.unwrap_or(-1))
    }

    /// Values that failed to serialize since the last call, as
    /// `(key, exception)` pairs: reported by the caller's thread, so that
    /// IO threads do not log (Python would register them as threads).
    fn take_errors(&self, py: Python<'_>) -> PyResult<Vec<(PyObject, PyObject)>> {
        if !self.hooks.has_errors.swap(false, Relaxed) {
            return Ok(Vec::new());
        }
        let errors = std::mem::take(&mut *self.hooks.errors.lock());
        errors
            .into_iter()
            .map(|(k, e)| Ok((k.to_py(py)?, e.into_value(py).into_any())))
            .collect()
    }

    /// Read these keys back ahead of use, in order (within the target).
    fn prefetch(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let keys = keys
            .iter()
            .map(PyKey::from_py)
            .collect::<PyResult<Vec<_>>>()?;
        self.with_buffer(py, move |buf| buf.prefetch(keys))
    }

    /// Read `keys` back if on disk (GIL released, joining reads in flight)
    /// and pin them in memory until the returned [`Held`] is released: what
    /// a task about to run needs, so that the event loop then finds its
    /// inputs in memory. Keys absent, or whose read fails, are skipped
    /// (whoever reads them next gets the error).
    fn hold(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> PyResult<Held> {
        let keys = keys
            .iter()
            .map(PyKey::from_py)
            .collect::<PyResult<Vec<_>>>()?;
        let pins: Vec<Pinned<PyValue>> = self.with_buffer(py, |buf| {
            keys.into_iter()
                .filter_map(|k| buf.get(&k).ok().flatten())
                .collect()
        })?;
        Ok(Held {
            pins: Mutex::new(pins),
        })
    }

    /// For a peer's `get_data`: each of `keys` as the peer is to be sent
    /// it, without deserializing anything. Meant for a thread that may
    /// block (not the event loop):
    ///
    /// - a value in memory as a Python object is pinned, in the returned
    ///   [`Held`], and given as `None`: it is sent as it is;
    /// - a value whose record is on disk is given as the frames its
    ///   serializer made, read from the record as stored: every read is
    ///   queued on the IO pool at once, this thread waits for them with
    ///   the GIL released, then checks each record and decompresses it if
    ///   it was stored compressed (the frames of one stored uncompressed
    ///   are read-only views of the bytes read, with no copy);
    /// - a value read back but never deserialized is given as its frames
    ///   too, from memory.
    ///
    /// Per key: `None` (an object, or absent), or `(frames, bytes, disk,
    /// outside)`: the frames, the bytes of the record as stored (or of the
    /// encoding in memory), whether it was read from disk, and the bytes
    /// of memory the frames hold that no gauge of the buffer counts (those
    /// of a record read from disk, decompressed; 0 for one in memory). A
    /// record that fails to read or check raises `RuntimeError`, naming
    /// the key.
    fn for_peer(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<(Held, PeerFrames)> {
        let ks = keys
            .iter()
            .map(PyKey::from_py)
            .collect::<PyResult<Vec<_>>>()?;
        let (pins, mut found) = self.with_buffer(py, |buf| peer_reads(buf, &ks))?;
        let held = Held {
            pins: Mutex::new(pins),
        };
        let mut out = Vec::with_capacity(ks.len());
        for (i, (k, got)) in ks.iter().zip(found.iter_mut()).enumerate() {
            // Not an `OSError`: the peer would take it for a broken
            // connection and stop asking this worker for its other keys.
            let named = |e: String| {
                PyRuntimeError::new_err(format!(
                    "spillbuffer: cannot read key {} to send it to a peer: {e}",
                    keys[i]
                        .repr()
                        .map(|r| r.to_string())
                        .unwrap_or_else(|_| format!("{k:?}"))
                ))
            };
            let (rec, bytes, disk) = match std::mem::replace(got, PeerRead::Object) {
                PeerRead::Object => {
                    out.push(None);
                    continue;
                }
                PeerRead::InMemory(rec) => {
                    let n = rec.len();
                    (rec, n, false)
                }
                PeerRead::OnDisk(Err(e)) => return Err(named(e.to_string())),
                PeerRead::OnDisk(Ok(None)) => {
                    out.push(None);
                    continue;
                }
                PeerRead::OnDisk(Ok(Some(rec))) => {
                    let n = rec.len() - spillbuffer::Record::HEADER_LEN;
                    let bytes = py
                        .allow_threads(|| RecordBytes::from_stored(rec))
                        .map_err(|e| named(e.to_string()))?;
                    (Arc::new(bytes), n, true)
                }
            };
            let frames = stored::frames_of(py, k, &rec)?;
            let outside = if disk { rec.len() } else { 0 };
            if disk {
                self.peer_disk_count.fetch_add(1, Relaxed);
                self.peer_disk_bytes.fetch_add(bytes as u64, Relaxed);
            } else {
                self.peer_memory_count.fetch_add(1, Relaxed);
            }
            out.push(Some((frames, bytes, disk, outside)));
        }
        Ok((held, out))
    }

    /// Is `key`'s value in memory now? (A memory hit, as a read's: it
    /// counts as a use.)
    fn in_memory(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = PyKey::from_py(key)?;
        self.with_buffer(py, |buf| buf.try_pin(&k).is_some())
    }

    /// The host is done with `key` for now: if in memory, make it the first
    /// to be evicted (at no cost if it has a disk copy). Returns whether it
    /// was in memory.
    fn consume(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = PyKey::from_py(key)?;
        self.with_buffer(py, |buf| match buf.try_pin(&k) {
            Some(p) => {
                p.consume();
                true
            }
            None => false,
        })
    }

    fn set_target(&self, py: Python<'_>, target: usize) -> PyResult<()> {
        self.with_buffer(py, |buf| buf.set_memory_target(target))
    }

    /// While `on`, the IO pool writes before it reads (the host's memory is
    /// short).
    fn set_writes_first(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        self.with_buffer(py, |buf| buf.set_writes_first(on))
    }

    /// Wait until all queued IO has finished (GIL released).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with_buffer(py, |buf| buf.flush_blocking())?
            .map_err(to_py_err)
    }

    /// Counters and gauges, as a dict: every field of the Rust `Stats`
    /// under its own name, plus the package's own serialization counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        // Each field under its own name. The pattern has no `..`, so a
        // field added to `Stats` fails to compile here until it is listed.
        macro_rules! put_all {
            ($stats:expr, $($field:ident),* $(,)?) => {
                let Stats { $($field),* } = $stats;
                $(d.set_item(stringify!($field), $field)?;)*
            };
        }
        let stats = self.with_buffer(py, |buf| buf.stats())?;
        // The weight of every live key's value, wherever it is.
        let weight_total =
            (stats.memory_bytes + stats.spilled_weight_bytes).saturating_sub(stats.detached_bytes);
        put_all!(
            stats,
            memory_bytes,
            memory_count,
            spilling_bytes,
            detached_bytes,
            detached_count,
            set_aside_bytes,
            spilled_weight_bytes,
            disk_bytes,
            disk_count,
            file_bytes,
            spilled_bytes_total,
            spill_count_total,
            unspilled_bytes_total,
            unspill_count_total,
            clean_evictions_total,
            spill_errors_total,
            spill_errors_encode_total,
            spill_errors_io_total,
            spill_budget_refusals_total,
            compacted_count_total,
            spill_seconds_total,
            unspill_seconds_total,
            records_sent_total,
            records_sent_encoded_total,
            records_sent_bytes_total,
            records_received_total,
            records_received_bytes_total,
            io_busy_seconds_total,
            locked_pins_total,
        );
        d.set_item("weight_total", weight_total)?;
        d.set_item(
            "serialize_seconds_total",
            self.hooks.serialize_nanos.load(Relaxed) as f64 * 1e-9,
        )?;
        d.set_item(
            "serialized_count_total",
            self.hooks.fresh_encodes.load(Relaxed),
        )?;
        d.set_item(
            "serialized_bytes_total",
            self.hooks.fresh_bytes.load(Relaxed),
        )?;
        d.set_item("peer_disk_count_total", self.peer_disk_count.load(Relaxed))?;
        d.set_item("peer_disk_bytes_total", self.peer_disk_bytes.load(Relaxed))?;
        d.set_item(
            "peer_memory_count_total",
            self.peer_memory_count.load(Relaxed),
        )?;
        d.set_item(
            "deserialize_seconds_total",
            self.deserialize_nanos.load(Relaxed) as f64 * 1e-9,
        )?;
        Ok(d)
    }

    /// The buffer's private spill directory.
    fn spill_dirs(&self, py: Python<'_>) -> PyResult<Vec<PathBuf>> {
        self.with_buffer(py, |buf| buf.spill_dirs())
    }

    /// Stop the IO pool and delete the spill files (GIL released while the
    /// IO threads finish). Values still in memory are dropped. Idempotent.
    fn close(&self, py: Python<'_>) {
        let buf = self.buf.write().take();
        release(py, buf);
    }

    fn closed(&self) -> bool {
        self.buf.read().is_none()
    }
}

/// What [`Core::for_peer`] gives per key.
type PeerFrames = Vec<Option<(Vec<PyObject>, usize, bool, usize)>>;

/// How a key is found for a peer ([`peer_reads`]).
enum PeerRead {
    /// In memory as an object (pinned), or absent.
    Object,
    /// Read back, never deserialized: its record, from memory.
    InMemory(crate::record::Record),
    /// Not in memory: its record as stored, or the error reading it.
    OnDisk(Result<Option<spillbuffer::Record>, Error>),
}

/// With the GIL released: pin the keys held as objects and read the
/// records of the others, every read queued before the first is awaited.
fn peer_reads(buf: &Buffer, keys: &[PyKey]) -> (Vec<Pinned<PyValue>>, Vec<PeerRead>) {
    let mut pins = Vec::new();
    let mut pending = Vec::with_capacity(keys.len());
    for k in keys {
        match buf.try_pin(k) {
            Some(p) if !p.has_object() && p.record().is_some() => {
                let rec = Arc::clone(p.record().expect("checked"));
                pending.push(Err(PeerRead::InMemory(rec)));
            }
            Some(p) => {
                pins.push(p);
                pending.push(Err(PeerRead::Object));
            }
            None => pending.push(Ok(buf.record(k))),
        }
    }
    let found = pending
        .into_iter()
        .map(|p| match p {
            Ok(read) => PeerRead::OnDisk(block_on(read)),
            Err(found) => found,
        })
        .collect();
    (pins, found)
}

/// Values pinned in memory by [`Core::hold`] until released.
#[pyclass(module = "spillbuffer._native", frozen)]
pub struct Held {
    pins: Mutex<Vec<Pinned<PyValue>>>,
}

#[pymethods]
impl Held {
    /// Unpin the values (idempotent; also done when this is collected).
    fn release(&self, py: Python<'_>) {
        let pins = std::mem::take(&mut *self.pins.lock());
        release(py, pins);
    }

    fn __len__(&self) -> usize {
        self.pins.lock().len()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Collected by Python, with the GIL held: unpin without it.
        let pins = std::mem::take(self.pins.get_mut());
        if !pins.is_empty() {
            Python::with_gil(|py| release(py, pins));
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // An IO thread may be waiting for the GIL (to serialize a value)
        // while the pool is shut down: release it while joining them.
        if let Some(buf) = self.buf.get_mut().take() {
            Python::with_gil(|py| release(py, buf));
        }
    }
}
