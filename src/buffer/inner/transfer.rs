//! Transfers without decoding: a key's record handed out as bytes
//! ([`SpillBuffer::record`]) and such bytes inserted as a key's record
//! ([`SpillBuffer::insert_record`], or straight from a reader with
//! [`SpillBuffer::insert_record_from`]). The store reads, encodes and writes
//! the records (`store::transfer`); this module picks the source of a
//! key's record, makes sure the bytes read were still that key's, and
//! installs a received record as an on-disk entry.

use super::read::Lookup;
use super::Inner;
use crate::buffer::accounting::Delta;
use crate::buffer::pinned::Pinned;
use crate::buffer::shard::After;
use crate::buffer::{Key, SpillBuffer};
use crate::error::{Error, Result};
use crate::frame::{Encoding, Record};
use crate::io::{Free, Priority};
use crate::metrics::Metrics;
use crate::store::transfer::{open_received, send_failed, transfer_path, Encoded, Streamed};
use crate::store::DiskLoc;
use crate::sync::atomic::Ordering::Relaxed;
use crate::sync::Arc;
use crate::value::Spill;
use std::borrow::Borrow;
use std::future::Future;
use std::hash::Hash;
use std::io::{Read, Write};

impl<K: Key, V: Spill> SpillBuffer<K, V> {
    /// `key`'s stored record as bytes, without decoding the value: to
    /// write to a socket or a file and insert into another buffer with
    /// [`SpillBuffer::insert_record`]. `None` if the key is absent.
    ///
    /// Never blocks the caller: the work runs on the IO pool. A value with
    /// a record on disk (spilled, or resident with a valid disk copy) is
    /// sent as stored — read, its header checked, not decompressed. A value
    /// only in memory is encoded as a spill would encode it (compressed
    /// under the same rule) but not written: the caller asked to send it,
    /// not to spill it, and writing would cost disk IO and space for a
    /// value that may be removed once sent. A large value whose memory is
    /// its encoding ([`Spill::as_encoded`]) and that does not compress is
    /// not even copied: the record holds it pinned, in memory and counted,
    /// until the record is dropped.
    ///
    /// The bytes are those of the value the key held when the record was
    /// taken; a key removed meanwhile gives `None`, a key replaced
    /// meanwhile the new value's record. Counted in
    /// [`Stats::records_sent_total`](crate::Stats::records_sent_total).
    ///
    /// The read is queued when this is called, not when the future is
    /// first polled, and the future borrows nothing: a sender can ask for
    /// the next few records and await them in order while it writes the
    /// first, without spawning a task for each (`examples/transfer.rs`).
    /// Dropping the future does not cancel the read; the record is
    /// dropped once read.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the record cannot be read, [`Error::Corrupt`]
    /// (naming the key and file) if its header is damaged, and
    /// [`Error::Encode`] if a value in memory fails to encode.
    pub fn record<Q>(
        &self,
        key: &Q,
    ) -> impl Future<Output = Result<Option<Record>>> + Send + 'static + use<K, V, Q>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // The job is queued here, at the call: see the type's docs.
        let rx = self.inner().key_of(key).map(|key| {
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.inner().submit(Priority::Demand, move |me| {
                let _ = tx.send(me.record_of(&key));
            });
            rx
        });
        async move {
            match rx {
                Some(rx) => rx.await.unwrap_or(Err(Error::Closed)),
                None => Ok(None),
            }
        }
    }

    /// [`SpillBuffer::record`] for blocking callers: the record is read
    /// (or the value encoded) on this thread.
    pub fn record_blocking<Q>(&self, key: &Q) -> Result<Option<Record>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.inner().key_of(key) {
            Some(key) => self.inner().record_of(&key),
            None => Ok(None),
        }
    }

    /// Insert `record` (made by [`SpillBuffer::record`] of a buffer with
    /// the same value type, possibly in another process) as `key`'s value,
    /// without decoding it: the bytes are written to disk as they came, on
    /// the IO pool, and the key goes straight to the on-disk state. The
    /// value is decoded only when it is pinned or got. Replaces any old
    /// value of the key in either tier, as [`SpillBuffer::insert`] does;
    /// the replacement happens when the write is done (when this
    /// resolves), and readers waiting on the old value's read get the new
    /// one. Until then the record's bytes count in
    /// [`Stats::memory_bytes`](crate::Stats::memory_bytes) (as detached).
    ///
    /// The memory target counts the value, once read back, at the weight
    /// the sending buffer gave it. The record is checked and its write
    /// queued when this is called, not when the future is first polled;
    /// the future only waits for the outcome, borrows nothing, and
    /// dropping it (polled or not) does not cancel the insert.
    ///
    /// # Errors
    ///
    /// [`Error::Corrupt`], naming the key, if the bytes are not a whole
    /// record of this format version: a damaged, truncated or extended
    /// transfer is refused here (headers, lengths, then the payload
    /// checksum, before anything is written). [`Error::DiskBudget`],
    /// [`Error::DiskFull`] or [`Error::Io`] if the write fails. On error
    /// nothing is inserted and any old value of the key stays.
    pub fn insert_record(
        &self,
        key: K,
        record: Record,
    ) -> impl Future<Output = Result<()>> + Send + 'static + use<K, V> {
        let inner = &self.handle.inner;
        let queued = match open_received(&record) {
            Err(detail) => Err(corrupt(&key, detail)),
            Ok(_) => {
                let held = Held::new(Arc::clone(inner), record.len());
                let (tx, rx) = tokio::sync::oneshot::channel();
                inner.submit(Priority::Spill, move |me| {
                    let res = me.receive(key, &record);
                    drop(record);
                    drop(held);
                    let _ = tx.send(res);
                });
                Ok(rx)
            }
        };
        async move { queued?.await.unwrap_or(Err(Error::Closed)) }
    }

    /// [`SpillBuffer::insert_record`] for blocking callers: the record is
    /// checked and written on this thread.
    pub fn insert_record_blocking(&self, key: K, record: Record) -> Result<()> {
        self.inner().receive(key, &record)
    }

    /// Read one record from `reader` (a socket, a file: the bytes a
    /// [`Record`] writes, frame header first) and insert it as `key`'s
    /// value, as [`SpillBuffer::insert_record_blocking`] would, without
    /// holding the whole record in memory: each piece that arrives is
    /// checksummed and written to disk while it is still in the cache, so
    /// the bytes pass through memory once on their way from the socket to
    /// the file. For blocking callers: the reads and writes run on this
    /// thread. The reader may go on with whatever follows the record.
    ///
    /// # Errors
    ///
    /// As [`SpillBuffer::insert_record`]: [`Error::Corrupt`], naming the
    /// key, if the bytes are not a whole record of this format version
    /// (a damaged header or payload, a stream that ends inside the
    /// record); [`Error::Io`] if `reader` fails; [`Error::DiskBudget`],
    /// [`Error::DiskFull`] or [`Error::Io`] if the write fails. On error
    /// nothing is inserted, any old value of the key stays, and the bytes
    /// already written are released; where `reader` stands within the
    /// record is then unspecified.
    pub fn insert_record_from<R: Read + ?Sized>(&self, key: K, reader: &mut R) -> Result<()> {
        self.inner().receive_from(key, reader)
    }

    /// Read one record from `reader` (a socket handed over by the host)
    /// and insert it as `key`'s value, as
    /// [`SpillBuffer::insert_record_from`] does, but off the caller's
    /// thread: never blocks the caller. The record goes from the stream to
    /// disk a piece at a time on one of the buffer's stream threads — each
    /// piece read, checksummed and written while it is still in that
    /// core's cache, the way a plain socket-to-file copy moves bytes — and
    /// the key is inserted only once the whole record checked out. The
    /// reader comes back when the record is in, positioned at whatever
    /// follows it (the next key of the host's protocol, say).
    ///
    /// The stream threads are the buffer's own, apart from the IO pool's
    /// disk threads: a peer that sends slowly, or stops, holds up only its
    /// own transfer (and, when 16 transfers wait on their peers at once,
    /// the ones queued behind them), never a spill, a read or a
    /// compaction. Give a socket a read timeout
    /// ([`std::net::TcpStream::set_read_timeout`]) so that a peer that
    /// vanished fails the transfer rather than hold a thread, and
    /// [`SpillBuffer::flush`] (which waits for transfers in progress too).
    ///
    /// The transfer is queued when this is called; the future only waits
    /// for the outcome, borrows nothing, and dropping it does not cancel
    /// the transfer (the reader is then dropped when it is done).
    ///
    /// # Errors
    ///
    /// As [`SpillBuffer::insert_record_from`], each naming the key:
    /// [`Error::Corrupt`] if the bytes are not a whole record of this
    /// format version (a damaged header or payload, a stream that ends
    /// inside the record); [`Error::Io`] if `reader` fails (a timeout,
    /// say); [`Error::DiskBudget`], [`Error::DiskFull`] or [`Error::Io`]
    /// if the write fails; [`Error::Io`] also if no stream thread could be
    /// started. On error nothing is inserted, any old value of the key
    /// stays, the disk space taken for the record is released, and the
    /// reader is dropped: where it stood within the record is unknown, so
    /// the stream cannot be read on.
    pub fn receive_record<R: Read + Send + 'static>(
        &self,
        key: K,
        reader: R,
    ) -> impl Future<Output = Result<R>> + Send + 'static + use<K, V, R> {
        let named = format!("{key:?}");
        self.on_stream_thread(named, move |inner| {
            let mut reader = reader;
            inner.receive_from(key, &mut reader).map(|()| reader)
        })
    }

    /// Write `key`'s record to `writer` (a socket handed over by the
    /// host), as [`SpillBuffer::record`] would hand it out followed by
    /// [`Record::write_to`], but on one of the buffer's stream threads and
    /// without holding the whole record in memory: never blocks the
    /// caller. A record on disk is sent as stored, a piece at a time, each
    /// piece read and written on by the same thread while it is still in
    /// that core's cache, as a plain file-to-socket copy does; nothing is
    /// decoded. A value only in memory is encoded first, as
    /// [`SpillBuffer::record`] encodes it. The writer comes back once the
    /// record is written (not flushed), with the number of bytes written,
    /// or at once with `None` and nothing written if the key is absent.
    ///
    /// The bytes are those of the value the key held when the send began:
    /// a key removed before gives `None`, one replaced before the new
    /// value's record. A record on disk is found to be still the key's
    /// before its first byte is read, and its bytes are then kept as they
    /// are until the last is written (its file is neither written over nor
    /// punched, even if the key is removed, replaced or its record moved
    /// meanwhile), so it goes out whole and unchanged; its header is
    /// checked before the first byte is written.
    /// A slow peer holds up only this transfer, as with
    /// [`SpillBuffer::receive_record`] (give a socket a write timeout).
    /// The transfer is queued when this is called; dropping the future
    /// does not cancel it. Counted in
    /// [`Stats::records_sent_total`](crate::Stats::records_sent_total).
    ///
    /// # Errors
    ///
    /// As [`SpillBuffer::record`], naming the key: [`Error::Io`] if the
    /// record cannot be read (some bytes may have been written),
    /// [`Error::Corrupt`] if its header is damaged or its file ends too
    /// soon, [`Error::Encode`] if a value in memory fails to encode (then
    /// nothing was written); [`Error::Io`] if `writer` fails (some bytes
    /// may have been written) or no stream thread could be started. On
    /// error the writer is dropped.
    pub fn send_record<Q, W: Write + Send + 'static>(
        &self,
        key: &Q,
        writer: W,
    ) -> impl Future<Output = Result<(W, Option<u64>)>> + Send + 'static + use<K, V, Q, W>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let queued = match self.inner().key_of(key) {
            None => Err(writer),
            Some(key) => {
                let named = format!("{key:?}");
                Ok(self.on_stream_thread(named, move |inner| {
                    let mut writer = writer;
                    let sent = inner.send_to(&key, &mut writer)?;
                    Ok((writer, sent))
                }))
            }
        };
        async move {
            match queued {
                Err(writer) => Ok((writer, None)),
                Ok(sent) => sent.await,
            }
        }
    }

    /// [`SpillBuffer::send_record`] for blocking callers: `key`'s record
    /// is written to `writer` on this thread, a piece at a time for a
    /// record on disk, with the same promises (the value the key held when
    /// the send began, whole; nothing decoded). Returns the bytes written,
    /// or `None`, with nothing written, if the key is absent.
    ///
    /// # Errors
    ///
    /// As [`SpillBuffer::send_record`].
    pub fn write_record_to<Q, W: Write + ?Sized>(
        &self,
        key: &Q,
        writer: &mut W,
    ) -> Result<Option<u64>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.inner().key_of(key) {
            Some(key) => self.inner().send_to(&key, writer),
            None => Ok(None),
        }
    }

    /// Run `work` on one of the buffer's stream threads (`named`: the key
    /// it moves, for the error if no thread can be started). The transfer
    /// is queued now; the future only waits for its outcome, and dropping
    /// it does not cancel the transfer.
    fn on_stream_thread<T, F>(
        &self,
        named: String,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static + use<K, V, T, F>
    where
        T: Send + 'static,
        F: FnOnce(&Inner<K, V>) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.handle.inner);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let queued = self
            .inner()
            .pool
            .submit_stream(Box::new(move |free: Free<'_>| {
                let res = work(&inner);
                // The thread is free before the caller wakes (`Free`).
                drop(free);
                let _ = tx.send(res);
            }));
        async move {
            match queued {
                Ok(true) => rx.await.unwrap_or(Err(Error::Closed)),
                Ok(false) => Err(Error::Closed),
                Err(e) => Err(no_thread(&named, e)),
            }
        }
    }
}

/// No stream thread could be started for the transfer of `key`.
fn no_thread(key: &str, e: std::io::Error) -> Error {
    Error::io(
        "start a stream thread",
        transfer_path(),
        std::io::Error::new(e.kind(), format!("transfer of key {key}: {e}")),
    )
}

/// Where a key's record comes from.
enum Source {
    Missing,
    /// Only in memory: encode it.
    Memory,
    /// Its record on disk, as the entry of `version` owns it.
    Disk {
        version: u64,
        loc: DiskLoc,
        weight: usize,
    },
}

fn corrupt<K: Key>(key: &K, detail: String) -> Error {
    Error::Corrupt {
        key: format!("{key:?}"),
        path: transfer_path(),
        detail,
    }
}

impl<K: Key, V: Spill> Inner<K, V> {
    /// The entry's own copy of `key`, if present.
    fn key_of<Q>(&self, key: &Q) -> Option<K>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.with_shard(self.shard_of(key), |shard| {
            shard.find(key).map(|i| shard.node(i).key.clone())
        })
    }

    fn source(&self, key: &K) -> Source {
        self.with_shard(self.shard_of(key), |shard| {
            let Some(i) = shard.find(key) else {
                return Source::Missing;
            };
            let n = shard.node(i);
            match n.state().disk() {
                Some(loc) => Source::Disk {
                    version: n.version,
                    loc,
                    weight: n.weight,
                },
                None => Source::Memory,
            }
        })
    }

    /// Does the entry of `key` at `version` still own the record at
    /// `loc`? If it does, that record was never released while it was
    /// being read, so no other write can have reused its bytes.
    fn owns(&self, key: &K, version: u64, loc: DiskLoc) -> bool {
        self.with_shard(self.shard_of(key), |shard| {
            shard
                .find_version(key, version)
                .is_some_and(|i| shard.node(i).state().disk() == Some(loc))
        })
    }

    /// `key`'s record: as stored if it has one, else encoded from memory.
    /// A record read while its key was removed, replaced or moved by
    /// compaction is not trusted (its bytes may belong to a later write):
    /// the key is looked up again.
    fn record_of(&self, key: &K) -> Result<Option<Record>> {
        loop {
            let rec = match self.source(key) {
                Source::Missing => return Ok(None),
                Source::Disk {
                    version,
                    loc,
                    weight,
                } => {
                    let res = self.store.read_record(key, loc);
                    if !self.owns(key, version, loc) {
                        continue;
                    }
                    Record::framed(weight as u64, res?)
                }
                Source::Memory => {
                    let Lookup::Hit(pin) = self.lookup(key, None) else {
                        continue;
                    };
                    let weight = pin.weight() as u64;
                    Metrics::add(&self.metrics.records_sent_encoded, 1);
                    match self.store.encode_for_transfer(key, &*pin)? {
                        Encoded::Record(bytes) => Record::framed(weight, bytes),
                        Encoded::InPlace(head) => {
                            Record::in_place(weight, &head, Box::new(PinnedEncoding(pin)))
                        }
                    }
                }
            };
            Metrics::add(&self.metrics.records_sent, 1);
            Metrics::add(&self.metrics.records_sent_bytes, rec.len() as u64);
            return Ok(Some(rec));
        }
    }

    /// Write `key`'s record to `w`, behind its frame header; returns the
    /// bytes written, or `None` if the key is absent. A record on disk is
    /// sent as stored a piece at a time, its segment held
    /// ([`Store::hold`](crate::store::Store::hold)) so that its bytes stay
    /// the ones the key had when the send began, even if the key is
    /// removed, replaced or its record moved meanwhile. A value only in
    /// memory is encoded whole first ([`Inner::record_of`]).
    fn send_to<W: Write + ?Sized>(&self, key: &K, w: &mut W) -> Result<Option<u64>> {
        loop {
            let (version, loc, weight) = match self.source(key) {
                Source::Missing => return Ok(None),
                Source::Memory => {
                    let Some(rec) = self.record_of(key)? else {
                        return Ok(None);
                    };
                    rec.write_to(w).map_err(|e| send_failed(key, e))?;
                    return Ok(Some(rec.len() as u64));
                }
                Source::Disk {
                    version,
                    loc,
                    weight,
                } => (version, loc, weight),
            };
            // Held first, then found still the key's: from then on its
            // bytes stay as they are. A record gone meanwhile: look again.
            let Some(held) = self.store.hold(loc) else {
                continue;
            };
            if !self.owns(key, version, loc) {
                continue;
            }
            let sent = held.send(key, weight as u64, w);
            drop(held);
            // A compaction that waited for the hold.
            self.queue_compactions();
            let len = sent?;
            Metrics::add(&self.metrics.records_sent, 1);
            Metrics::add(&self.metrics.records_sent_bytes, len);
            return Ok(Some(len));
        }
    }

    /// Check `rec` whole and write it as `key`'s record, then make it the
    /// key's entry (on disk), replacing any other.
    fn receive(&self, key: K, rec: &Record) -> Result<()> {
        let received = open_received(rec).map_err(|d| corrupt(&key, d))?;
        received.check_payload().map_err(|d| corrupt(&key, d))?;
        let loc = self.store.write_received(&key, &received)?;
        self.install(key, loc, received.weight, rec.len() as u64);
        Ok(())
    }

    /// Read one record from `reader` and write it to disk as it comes
    /// (`Store::write_streamed`), then make it the key's entry; a record
    /// refused part way has its bytes released, and nothing is inserted.
    fn receive_from<R: Read + ?Sized>(&self, key: K, reader: &mut R) -> Result<()> {
        match self.store.write_streamed(&key, reader)? {
            Streamed::Whole { loc, weight, len } => {
                self.install(key, loc, weight, len);
                Ok(())
            }
            Streamed::Refused { loc, error } => {
                let after = After {
                    release: Some(loc),
                    ..After::default()
                };
                self.act(self.shard_of(&key), after);
                Err(error)
            }
        }
    }

    /// Make the record just written at `loc` (`len` bytes received) the
    /// entry of `key`, on disk, replacing any other.
    fn install(&self, key: K, loc: DiskLoc, weight: usize, len: u64) {
        let version = self.next_version.fetch_add(1, Relaxed);
        let s = self.shard_of(&key);
        let (after, read) = self.with_shard(s, |shard| {
            shard.insert_received(key.clone(), loc, weight, version)
        });
        Metrics::add(&self.metrics.records_received, 1);
        Metrics::add(&self.metrics.records_received_bytes, len);
        self.act(s, after);
        if read {
            self.start_read(key, version, loc);
        }
        // A replaced value in memory is gone.
        self.wake_mem_waiters();
        self.queue_compactions();
    }
}

/// A pinned value whose memory is its encoding: the payload of a record
/// sent without a copy.
struct PinnedEncoding<V>(Pinned<V>);

impl<V: Spill> Encoding for PinnedEncoding<V> {
    fn bytes(&self) -> &[u8] {
        // `as_encoded` gave these bytes when the record header was made;
        // a type that changed its mind gives a record that fails its
        // checksum, never a wrong value.
        self.0.as_encoded().unwrap_or(&[])
    }
}

/// The bytes of a received record while its write is queued or running:
/// memory the buffer holds, counted as a detached value held by an IO job
/// (the same gauges as a value queued to be freed) until this is dropped,
/// whether the job ran or was dropped unrun at shutdown.
struct Held<K: Key, V: Spill> {
    inner: Arc<Inner<K, V>>,
    bytes: usize,
}

impl<K: Key, V: Spill> Held<K, V> {
    fn new(inner: Arc<Inner<K, V>>, bytes: usize) -> Self {
        inner.accounting.apply_unsharded(Delta::freeing(bytes));
        Held { inner, bytes }
    }
}

impl<K: Key, V: Spill> Drop for Held<K, V> {
    fn drop(&mut self) {
        self.inner
            .accounting
            .apply_unsharded(Delta::freeing(self.bytes).negate());
        self.inner.wake_mem_waiters();
    }
}
