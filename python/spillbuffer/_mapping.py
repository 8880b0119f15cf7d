"""``SpillBuffer``: the Rust buffer as a ``MutableMapping`` a Dask worker
accepts as its ``data``."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, MutableMapping
from contextvars import ContextVar
from typing import Any, Callable, NamedTuple

from . import _native
from ._serialize import Dumps, as_serialized, loads, on_spill_error

try:
    from distributed.metrics import context_meter
except ImportError:  # pragma: no cover - without distributed there is no meter
    context_meter = None

# The meter's callbacks in the current context (distributed's ContextMeter
# keeps them in a context variable; a read with none set reports to no
# one, so a memory hit may skip the meter). ``None``: unknown, always meter.
_meter_callbacks = getattr(context_meter, "_callbacks", None)
if _meter_callbacks is not None and not hasattr(_meter_callbacks, "get"):  # pragma: no cover - another distributed
    _meter_callbacks = None
# Its bound ``get``, looked up once: ``__getitem__`` calls it on every hit.
_meter_callbacks_now = _meter_callbacks.get if _meter_callbacks is not None else None

#: ``core[key]``'s answer when the key is not a memory hit of an object.
_MISS = object()

logger = logging.getLogger("distributed.spill")

#: In a peer's ``get_data`` (set by ``spillbuffer._peers``): the keys
#: staged to be sent without deserializing them (``stage_for_peer``).
for_peer: ContextVar[dict | None] = ContextVar("spillbuffer_for_peer", default=None)

# id -> buffer, for closing at exit (a mapping is unhashable).
_live: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@atexit.register
def _close_all() -> None:
    # Stop the IO threads while the interpreter can still serve them.
    for buf in list(_live.values()):
        buf.close()


class SpilledSize(NamedTuple):
    """Size of the values not in memory: their weight (``sizeof``) and the
    bytes their records take on disk."""

    memory: int
    disk: int


def _default_weight() -> Callable[[object], int]:
    try:
        from dask.sizeof import sizeof
    except ImportError:
        return sys.getsizeof

    def weight(value: object) -> int:
        try:
            return int(sizeof(value))
        except Exception:  # as distributed's safe_sizeof: never fail an insert
            logger.warning("sizeof() failed on a %s; using sys.getsizeof", type(value).__name__, exc_info=True)
            return sys.getsizeof(value)

    return weight


def _default_compression() -> str:
    """What a Dask worker would compress its spilled data with: its
    ``distributed.worker.memory.spill-compression`` setting, whose ``auto``
    means lz4 if the ``lz4`` package is importable (else snappy if that
    is, else none). The buffer's only compressor is lz4 (its own, in Rust,
    needing no Python package): any compressor named means lz4, none means
    none. Without distributed, lz4."""
    try:
        import dask.config
        from distributed.protocol.compression import compressions
    except ImportError:
        return "lz4"
    name = dask.config.get("distributed.worker.memory.spill-compression", "auto")
    if name == "auto":
        # What distributed resolved its own "auto" to on this host.
        name = getattr(compressions.get("auto"), "name", None)
    return "lz4" if name else "none"


def _check_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (bytes), not {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")
    return value


class _Tier(Mapping):
    """A read-only view of one tier: ``fast`` (values in memory) or ``slow``
    (values only on disk). Its length comes from the buffer's gauges;
    membership and iteration from the buffer's index. A value being
    written counts as in memory until its write is done; a value being
    read back, as on disk until its read is done."""

    def __init__(self, owner: SpillBuffer, resident: bool):
        self._owner = owner
        self._resident = resident

    def __len__(self) -> int:
        core = self._owner._core
        in_memory = core.stats()["memory_count"]
        return in_memory if self._resident else max(len(core) - in_memory, 0)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __contains__(self, key: object) -> bool:
        core = self._owner._core
        try:
            return core.contains(key) and core.resident(key) == self._resident
        except TypeError:
            return False

    def __iter__(self) -> Iterator:
        return iter(self._owner._core.keys_where_resident(self._resident))

    def __getitem__(self, key: object) -> object:
        """The value, if in this tier (reading one on disk brings it to
        memory, as any read does)."""
        if key not in self:
            raise KeyError(key)
        return self._owner[key]

    def __repr__(self) -> str:
        return f"<{'fast' if self._resident else 'slow'} tier of {self._owner!r}: {len(self)} values>"


class _Staged:
    """What ``stage_for_peer`` holds until its keys are sent: the values
    pinned in memory, and the bytes of the records it read from disk,
    which count against the buffer's target until ``release()``."""

    def __init__(self, owner: SpillBuffer, held, outside: int):
        self._owner = owner
        self._held = held
        self._outside = outside

    def release(self) -> None:
        """Unpin the values and give the staged bytes back to the target
        (idempotent; also done when this is collected)."""
        self._held.release()
        outside, self._outside = self._outside, 0
        if outside and not self._owner._core.closed():
            self._owner._staging(-outside)

    def __len__(self) -> int:
        return len(self._held)

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # pragma: no cover - at interpreter exit
            pass


class SpillBuffer(MutableMapping):
    """A mapping that keeps values in memory under a byte ``target`` and
    spills the least recently used to ``directory`` on a dedicated IO pool.

    Parameters mirror the Rust builder:

    directory
        Where the private spill sub-directory is made (created if missing).
    target
        Bytes of values (by ``weight``) kept in memory before spilling starts.
    limit
        Back-pressure: ``data[k] = v`` waits (GIL released) while the values
        the buffer holds (in memory, including those being written) weigh
        more than this and writes in flight will bring them down. At least
        ``target``; defaults to ``target``. Memory then stays within
        ``limit`` plus about ``io_threads + 1`` of the largest values.
    max_spill
        Disk budget in bytes; ``False``/``None`` for none. Values refused by
        it stay in memory.
    compression
        ``"lz4"`` (per record, skipped when it does not pay), ``None``, or
        ``"auto"`` (the default): as a Dask worker would, following
        distributed's ``distributed.worker.memory.spill-compression``
        (whose own ``auto`` is lz4 only if the ``lz4`` package is
        installed); lz4 when distributed is not installed.
    io_threads
        Threads of the IO pool.
    weight
        ``weight(value) -> int``: the bytes a value counts for. Defaults to
        ``dask.sizeof.sizeof`` when dask is importable, else ``sys.getsizeof``.
    write_headroom
        Keep memory free for the copies writes make: each IO thread writing
        a value holds an encoded copy of it until the write lands, so the
        target the buffer evicts to is lowered by ``io_threads`` times the
        heaviest value inserted so far (down to a quarter of ``target`` at
        most). Off by default; the Dask factory turns it on.
    evict_in_flight
        ``evict()`` (the memory monitor's manual eviction) declines, returning
        -1, while this many bytes or more are still being written, so that a
        monitor re-reading process memory does not evict the whole memory
        tier before the first writes land, unless ``memory_over`` tells it
        how much has to leave memory. Defaults to ``target // 8``.

    Keys may be str, bytes, int, float, bool, None and tuples of them;
    values any object that pickles (or that distributed can serialize).
    """

    #: How long ``evict()`` waits (GIL released) for the write it queued
    #: to land, for a value lighter than ``evict_heavy``.
    evict_wait = 0.02
    #: From this weight on, ``evict()`` counts a value whose write has not
    #: landed within ``evict_wait`` as leaving memory and lets the monitor
    #: go on (a lighter one is expected to land within the wait).
    evict_heavy = 1 << 20
    #: ``() -> int``: the bytes by which process memory is over what the
    #: worker's memory monitor evicts down to, or ``None`` (unknown). Set
    #: by the Dask factory (``spillbuffer.dask``); ``evict()`` then keeps
    #: that much being written, instead of ``evict_in_flight``.
    memory_over: Callable[[], int | None] | None = None
    #: Of each ``evict_window`` seconds, ``evict()`` spends at most this
    #: long (waiting for light values' writes, on the caller's thread: the
    #: event loop for the memory monitor) before it declines, returning -1,
    #: until the next window: a monitor's round over many small values
    #: would otherwise hold the event loop for half a second at a time.
    evict_budget = 0.05
    evict_window = 0.1

    def __init__(
        self,
        directory: str | os.PathLike,
        target: int = 1 << 30,
        limit: int | None = None,
        max_spill: int | bool | None = False,
        compression: str | None = "auto",
        io_threads: int = 2,
        weight: Callable[[object], int] | None = None,
        write_headroom: bool = False,
        evict_in_flight: int | None = None,
    ):
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path, not {type(directory).__name__}: {directory!r}")
        directory = os.fspath(directory)
        target = _check_int("target", target)
        if limit is not None:
            limit = _check_int("limit", limit, target)
        if max_spill is False or max_spill is None:
            max_spill = None
        else:
            max_spill = _check_int("max_spill", max_spill)
        if compression == "auto":
            compression = _default_compression()
        if compression in (None, False, "none"):
            compression = "none"
        elif compression != "lz4":
            raise ValueError(f"compression must be 'lz4', 'auto' or None, not {compression!r}")
        #: The compression in use: ``"lz4"`` or ``None``.
        self.compression = None if compression == "none" else compression
        io_threads = _check_int("io_threads", io_threads, 1)
        if weight is not None and not callable(weight):
            raise TypeError(f"weight must be callable, not {type(weight).__name__}")
        if evict_in_flight is None:
            evict_in_flight = max(target // 8, 1)
        self._evict_in_flight = _check_int("evict_in_flight", evict_in_flight, 1)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise OSError(e.errno, f"cannot create spill directory {directory}: {e.strerror}") from e
        self.directory = directory
        self.target = target
        #: The back-pressure threshold (see ``limit`` above).
        self.limit = target if limit is None else limit
        self.max_spill = False if max_spill is None else max_spill
        self._weight = weight if weight is not None else _default_weight()
        self._dumps = Dumps()
        self._core = _native.Core(directory, target, limit, max_spill, compression, io_threads, self._dumps, _MISS)
        self._io_threads = io_threads
        self._write_headroom = bool(write_headroom)
        self._heaviest = 0
        #: Bytes of records read from disk for peers and not sent yet
        #: (``stage_for_peer``): memory the buffer's gauges do not see,
        #: taken off the target it evicts to meanwhile.
        self._staged_bytes = 0
        self._staged_lock = threading.Lock()
        #: ``evict()``'s time budget: the current window and the time spent in it.
        self._evict_window_start = float("-inf")
        self._evict_spent = 0.0
        self._seen = dict.fromkeys(_COUNTERS, 0.0)
        self._memory_reads = 0
        #: Reads of __getitem__ that waited for the disk (not prefetched in time).
        self._demand_reads = 0
        self._memory_read_bytes = 0
        #: Peers' ``get_data`` calls being served (see ``spillbuffer._peers``).
        self._serving_peers = 0
        #: Weight of values deserialized, and reads that waited for the
        #: disk, in ``__getitem__`` while serving a peer.
        self._peer_deserialized_bytes = 0
        self._peer_loop_reads = 0
        _live[id(self)] = self

    # ----- the mapping --------------------------------------------------

    def __setitem__(self, key: object, value: object) -> None:
        """Insert. Spills run on the IO pool; this waits for them (GIL
        released) only while the buffer holds more than ``limit`` and
        writes in flight will bring it down (back-pressure), and not when
        spilling is failing (the value is then kept in memory)."""
        weight = int(self._weight(value))
        if self._write_headroom and weight > self._heaviest:
            self._heaviest = weight
            self._apply_target()
        flags = self._core.set(key, value, weight)
        if flags & 2:
            self._digest_io()
        if flags & 1:
            self._report_errors()

    def __getitem__(self, key: object) -> object:
        """The value; one on disk is read back with the GIL released (and
        this thread waiting), joining a prefetch already in flight."""
        if not self._serving_peers and (_meter_callbacks_now is None or not _meter_callbacks_now()):
            # A memory hit, with no meter to tell (hits are counted natively).
            value = self._core[key]
            if value is not _MISS:
                return value
        if self._serving_peers:
            staged = for_peer.get()
            if staged is not None:
                return self._get_for_peer(key, staged)
        try:
            value, weight, waited, _ = self._core.get(key, loads)
        except TypeError:
            raise KeyError(key) from None
        if waited:
            self._demand_reads += 1
            self._digest_io()
            self._report_errors()
        else:
            self._memory_reads += 1
            self._memory_read_bytes += weight
            if context_meter is not None:
                context_meter.digest_metric("memory-read", 1, "count")
                context_meter.digest_metric("memory-read", weight, "bytes")
        return value

    def _get_for_peer(self, key: object, staged: dict) -> object:
        """``__getitem__`` in a peer's ``get_data``: the staged form of
        ``key`` if it has one (see ``stage_for_peer``), else the value,
        counting what had to be read or deserialized for it."""
        try:
            return staged[key]
        except (KeyError, TypeError):
            pass
        try:
            value, weight, waited, deserialized = self._core.get(key, loads)
        except TypeError:
            raise KeyError(key) from None
        self._peer_loop_reads += waited
        if deserialized:
            self._peer_deserialized_bytes += weight
        return value

    def __contains__(self, key: object) -> bool:
        try:
            return self._core.contains(key)
        except TypeError:
            return False

    def __delitem__(self, key: object) -> None:
        try:
            self._core.delete(key)
        except TypeError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator:
        return iter(self._core.keys())

    def __len__(self) -> int:
        return len(self._core)

    def __repr__(self) -> str:
        if self._core.closed():
            return "<spillbuffer.SpillBuffer (closed)>"
        s = self._core.stats()
        return (
            f"<spillbuffer.SpillBuffer: {len(self)} keys, {s['memory_count']} in memory "
            f"({s['memory_bytes']} B of target {self.target} B), {s['disk_bytes']} B on disk>"
        )

    def __reduce__(self):
        raise TypeError(
            "a SpillBuffer belongs to the process that made it and cannot be pickled; "
            "to give workers one, pass data=spillbuffer.dask.data()"
        )

    # ----- what distributed's worker uses -------------------------------

    @property
    def fast(self) -> _Tier:
        """The values in memory (a sized view)."""
        return _Tier(self, True)

    @property
    def slow(self) -> _Tier:
        """The values only on disk (a sized view)."""
        return _Tier(self, False)

    @property
    def memory(self) -> _Tier:
        """``fast`` once queued IO has finished. For inspection (tests): it
        waits for the IO pool."""
        self.flush()
        return self.fast

    @property
    def disk(self) -> _Tier:
        """``slow`` once queued IO has finished. For inspection (tests): it
        waits for the IO pool."""
        self.flush()
        return self.slow

    def evict(self) -> int:
        """The memory monitor's manual eviction: queue the least recently
        used value for writing (or drop it, if it has a disk copy) and
        return its weight. Memory falls only when a write lands, while the
        monitor evicts, re-reads process memory and evicts again until it
        is low enough; so:

        - while writes under way already cover what has to leave memory
          (``memory_over()``, or ``evict_in_flight`` bytes when that is not
          known or not positive), this evicts nothing and returns -1, which
          ends the monitor's round; the weight returned is counted up to
          that, so the monitor never totals more than it needed while
          memory has not fallen yet (it would run the garbage collector);
        - the write of a value lighter than ``evict_heavy`` is waited for
          up to ``evict_wait`` seconds (GIL released); one that has not
          landed by then returns -1 and holds further evictions until it
          has;
        - a heavier value counts as leaving memory once queued, and the
          monitor goes on;
        - of every ``evict_window`` seconds it spends at most about
          ``evict_budget`` in calls (its caller, the monitor, runs on the
          event loop); past that it returns -1 until the next window.

        Returns -1 too when nothing is evictable or the write fails within
        the wait. Never raises."""
        start = time.monotonic()
        if start - self._evict_window_start >= self.evict_window:
            self._evict_window_start, self._evict_spent = start, 0.0
        elif self._evict_spent >= self.evict_budget:
            return -1
        try:
            over = self.memory_over() if self.memory_over is not None else None
            cap = over if over is not None and over > 0 else self._evict_in_flight
            weight = self._core.evict_one(cap, self.evict_wait, self.evict_heavy)
            self._evict_spent += time.monotonic() - start
            self._digest_io()
            self._report_errors()
            return weight
        except Exception:
            logger.error("Manual eviction failed; keeping data in memory", exc_info=True)
            return -1

    @property
    def spilled_total(self) -> SpilledSize:
        """Weight of the values not in memory, and bytes of live records on
        disk (including the disk copies of values also in memory)."""
        s = self._core.stats()
        return SpilledSize(s["spilled_weight_bytes"], s["disk_bytes"])

    @property
    def cumulative_metrics(self) -> dict[tuple[str, str], float]:
        """Ever-increasing totals keyed by (activity, unit), units being
        ``count``, ``bytes`` and ``seconds`` as distributed's Prometheus
        exporter expects. Disk reads include prefetches; seconds of disk IO
        are IO-pool time, not time the caller waited."""
        hits, hit_bytes = self._core.hits()
        out = {
            ("memory-read", "count"): float(self._memory_reads + hits),
            ("memory-read", "bytes"): float(self._memory_read_bytes + hit_bytes),
        }
        out.update(self._io_totals())
        return out

    # ----- spillbuffer's own --------------------------------------------

    def prefetch(self, keys) -> None:
        """Read these keys back ahead of use, in order, on the IO pool, as
        far as they fit within the target next to what is resident."""
        # Keys in memory are left out here, asking the buffer's index with
        # the GIL held: on a workload of many small values most are, and
        # every other call into the buffer releases the GIL, which the
        # event loop may then wait milliseconds to get back.
        keys = [k for k in keys if not self._resident(k) and k in self]
        if keys:
            self._core.prefetch(keys)

    def hold(self, keys):
        """Read ``keys`` back if on disk (waiting with the GIL released) and
        keep them in memory, never evicted, until ``release()`` is called
        on the returned handle. Absent keys and failed reads are skipped
        (the next read of the key reports the error)."""
        keys = [k for k in keys if k in self]
        return self._core.hold(keys)

    def _resident(self, key: object) -> bool:
        """In memory, by the buffer's index (the GIL held; not a use)."""
        try:
            return self._core.resident(key)
        except TypeError:
            return False

    def stage_for_peer(self, keys) -> tuple[Any, dict]:
        """Prepare ``keys`` to be sent to a peer, without deserializing
        anything; blocks (the GIL released) while records are read, so
        call it off the event loop. Values in memory as objects are pinned
        until ``release()`` is called on the returned handle (they are sent
        as they are); values on disk are read on the IO pool as stored and
        returned, in the dict, as distributed's ``Serialized`` (the header
        and frames its serializer made); so are values read back but never
        deserialized, from memory. The records read from disk take memory
        the buffer's gauges do not see: until ``release()``, the target the
        buffer evicts to is lowered by their bytes (down to a quarter of
        ``target``). Absent keys are left out. A record that fails to read
        raises ``RuntimeError`` naming its key."""
        keys = [k for k in keys if k in self]
        held, found = self._core.for_peer(keys)
        staged = {}
        outside = 0
        for key, got in zip(keys, found):
            if got is not None:
                serialized = as_serialized(got[0])
                if serialized is not None:
                    staged[key] = serialized
                    outside += got[3]
        if outside:
            self._staging(outside)
        return _Staged(self, held, outside), staged

    def _staging(self, delta: int) -> None:
        """Records of ``delta`` bytes were staged for a peer (or, negative,
        sent): the target the buffer evicts to is lowered by what is staged,
        so that the process holds no more than it would without them."""
        with self._staged_lock:
            self._staged_bytes += delta
        self._apply_target()

    def _apply_target(self) -> None:
        """Set the target the buffer evicts to: ``target`` less the write
        headroom and the bytes staged for peers, down to a quarter of it.
        Under a lock, from the figures as they are then, so that of two
        threads changing them the last to apply sets the target."""
        with self._staged_lock:
            headroom = self._io_threads * self._heaviest if self._write_headroom else 0
            self._core.set_target(max(self.target - headroom - self._staged_bytes, self.target // 4))

    def in_memory(self, key: object) -> bool:
        """Is ``key``'s value in memory now (reading it would not wait for
        the disk)? Counts as a use of it for eviction."""
        try:
            return self._core.in_memory(key)
        except TypeError:
            return False

    def consume(self, key: object) -> bool:
        """Done with ``key`` for now: if in memory, make it the first to be
        evicted (freed at once if it has a disk copy). Returns whether it was
        in memory."""
        try:
            return self._core.consume(key)
        except TypeError:
            return False

    def set_writes_first(self, on: bool) -> None:
        """Tell the buffer whether the process's memory is short: while
        ``on``, its IO pool writes values out before it reads any back
        (reads, prefetches included, then wait longer). The Dask plugin
        turns it on while process memory is over the worker's target
        fraction."""
        self._core.set_writes_first(bool(on))

    def flush(self) -> None:
        """Wait until all queued IO has finished (the GIL is released)."""
        self._core.flush()
        self._report_errors()

    def stats(self) -> dict[str, float]:
        """Every field of the Rust buffer's ``Stats`` under its own name
        (docs/stats.md), plus the package's serialization counters and
        what serving peers took."""
        s = self._core.stats()
        s["peer_deserialized_bytes_total"] = self._peer_deserialized_bytes
        s["peer_loop_reads_total"] = self._peer_loop_reads
        return s

    @property
    def spill_directory(self) -> str:
        """The buffer's private spill sub-directory."""
        return os.fspath(self._core.spill_dirs()[0])

    def close(self) -> None:
        """Stop the IO pool and delete the spill files. Values still in
        memory are dropped. Idempotent; also done at interpreter exit."""
        self._core.close()

    def _report_errors(self) -> None:
        """Log values that failed to serialize on the IO pool (once each)."""
        for key, exc in self._core.take_errors():
            on_spill_error(key, exc)

    def _digest_io(self) -> None:
        """Report IO finished since the last report to distributed's
        context meter: writes run on the IO pool, so they are attributed to
        the caller that inserts or reads next."""
        if context_meter is None:
            return
        seen = self._seen
        for name, total in self._io_totals().items():
            delta = total - seen[name]
            if delta > 0:
                seen[name] = total
                context_meter.digest_metric(name[0], delta, name[1])

    def _io_totals(self) -> dict[tuple[str, str], float]:
        """(activity, unit) -> total of the IO pool's work so far. As in a
        worker, whose ``serialize`` meter excludes the ``compress`` one
        nested in it, the serializer's compression step is reported apart."""
        s = self._core.stats()
        out = {name: float(s[field]) for name, field in _COUNTERS.items()}
        compress = self._dumps.compress_seconds
        out["compress", "seconds"] = compress
        out["serialize", "seconds"] = max(out["serialize", "seconds"] - compress, 0.0)
        return out


# (activity, unit) -> field of Core.stats(), in the order a spill and an
# unspill produce them (``compress``, from the serializer, goes after
# ``serialize``; see SpillBuffer._io_totals).
_COUNTERS = {
    ("serialize", "seconds"): "serialize_seconds_total",
    ("compress", "seconds"): "serialize_seconds_total",
    ("disk-write", "seconds"): "spill_seconds_total",
    ("disk-write", "count"): "spill_count_total",
    ("disk-write", "bytes"): "spilled_bytes_total",
    ("disk-read", "seconds"): "unspill_seconds_total",
    ("disk-read", "count"): "unspill_count_total",
    ("disk-read", "bytes"): "unspilled_bytes_total",
    ("deserialize", "seconds"): "deserialize_seconds_total",
}
