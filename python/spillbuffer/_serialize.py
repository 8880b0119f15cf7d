"""How values become frames and back.

With distributed installed, values are serialized as a Dask worker does when
it spills (``serialize_bytelist``, whose frames are zero-copy views for numpy
and other dask-serializable types); without it, with pickle protocol 5 and
out-of-band buffers. The first frame names the codec, so a buffer can read
back what it wrote whichever is installed.

``dumps`` runs on the buffer's IO threads, holding the GIL only for the
serializer's own work; the byte copies and file IO happen after it returns,
without the GIL. ``loads`` gets writable views of memory the buffer owns, so
arrays come back without a copy.
"""

from __future__ import annotations

import logging
import pickle
import threading

try:
    import msgpack
    from distributed.metrics import context_meter
    from distributed.protocol import serialize_bytelist
    from distributed.protocol.compression import decompress
    from distributed.protocol.serialize import Serialized, merge_and_deserialize
except ImportError:  # pragma: no cover - exercised in environments without distributed
    serialize_bytelist = None
    context_meter = None

logger = logging.getLogger("distributed.spill")

_DISTRIBUTED = b"d"
_NO_SPLIT = 1 << 62
_PICKLE = b"p"


def _as_bytes_frame(frame):
    """A C-contiguous unsigned-byte view of ``frame`` (copying only a frame
    that is not contiguous)."""
    view = memoryview(frame)
    if view.nbytes == 0:
        # An empty frame (an empty pandas piece, say): a view with a zero
        # in its shape or strides cannot be cast.
        return memoryview(b"")
    if view.c_contiguous:
        return view.cast("B") if view.format != "B" or view.ndim != 1 else view
    return memoryview(bytes(view))


class Dumps:
    """``dumps`` for one buffer, keeping the seconds distributed's
    serializer spent in its compression step (``compress``, which it
    meters itself, as when a worker spills), so that the buffer can report
    them apart from ``serialize`` as a worker does. The buffer compresses
    records itself (lz4, in the IO pool, counted in ``disk-write``); the
    serializer is asked not to, so this is the time it takes to decide so."""

    def __init__(self) -> None:
        #: Seconds of ``compress`` metered inside the serializer so far.
        self.compress_seconds = 0.0

    def _digest(self, label, value: float, unit: str) -> None:
        if label == "compress" and unit == "seconds":
            self.compress_seconds += value

    def __call__(self, obj: object) -> list:
        if context_meter is None:
            return dumps(obj)
        # On an IO thread no other callback is set: the metrics of the
        # serializer would go nowhere.
        with context_meter.add_callback(self._digest):
            return dumps(obj)


def dumps(obj: object) -> list:
    """Serialize ``obj`` into a list of byte frames. Called on the buffer's
    IO threads."""
    ident = threading.get_ident()
    known = ident in threading._active
    try:
        return _dumps(obj)
    finally:
        if not known:
            # Code that logs (distributed's serializer logs its failures)
            # makes Python register this IO thread as a threading._DummyThread,
            # listed by threading.enumerate() until the interpreter exits
            # (dask's test harness reports those as leaked threads). It is
            # not a Python thread: forget it again.
            _forget_dummy(ident)


def _forget_dummy(ident: int) -> None:
    with threading._active_limbo_lock:
        if isinstance(threading._active.get(ident), threading._DummyThread):
            del threading._active[ident]


def _dumps(obj: object) -> list:
    if serialize_bytelist is not None:
        # distributed's own framing: [prelude, header, *frames]. The prelude
        # (frame lengths) is redundant with the buffer's envelope. Frames are
        # not compressed here: the buffer compresses records itself (lz4,
        # skipped when it does not pay).
        # Frames are not split either (``size``): split frames would be merged
        # back by a copy when read.
        frames = serialize_bytelist(obj, compression=False, on_error="raise", size=_NO_SPLIT)
        return [_DISTRIBUTED, *map(_as_bytes_frame, frames[1:])]
    buffers: list = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return [_PICKLE, head, *(_as_bytes_frame(b.raw()) for b in buffers)]


def loads(frames: list) -> object:
    """Rebuild an object from the frames ``dumps`` made."""
    frames = [memoryview(f) for f in frames]
    tag = bytes(frames[0])
    if tag == _DISTRIBUTED:
        if serialize_bytelist is None:
            raise RuntimeError("this value was spilled with distributed, which is not importable now")
        # As distributed's deserialize_bytes, on frames already split.
        bin_header = frames[1]
        header = msgpack.loads(bin_header, raw=False, use_list=False) if len(bin_header) else {}
        return merge_and_deserialize(header, decompress(header, list(frames[2:])))
    if tag == _PICKLE:
        return pickle.loads(frames[1], buffers=frames[2:])
    raise ValueError(f"unknown spillbuffer record codec {tag!r}")


def as_serialized(frames: list):
    """The frames ``dumps`` made, as distributed's ``Serialized`` (its
    header and frames): what a worker's comm sends on as they are, to be
    deserialized by the peer only. ``None`` for a value written without
    distributed (pickle), which has no such form."""
    if serialize_bytelist is None or bytes(frames[0]) != _DISTRIBUTED:
        return None
    bin_header = frames[1]
    header = msgpack.loads(bin_header, raw=False, use_list=False) if len(bin_header) else {}
    return Serialized(header, [memoryview(f) for f in frames[2:]])


def on_spill_error(key: object, exc: BaseException) -> None:
    """Report a value that failed to serialize as distributed does: on the
    ``distributed.spill`` logger, with the traceback. The value stays in
    memory. Called on the caller's thread (see ``SpillBuffer``)."""
    logger.error("Failed to pickle %r", key, exc_info=(type(exc), exc, exc.__traceback__))
