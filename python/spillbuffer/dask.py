"""Turning spillbuffer on in a Dask cluster.

``data()`` is what a worker takes as ``data=`` (``Worker``, ``Nanny``,
``LocalCluster``, ``dask worker --data``...): a ``(callable, kwargs)`` pair,
picklable for nanny processes, whose callable builds a ``SpillBuffer`` in
the worker's local directory. ``PrefetchPlugin`` is a worker plugin that
reads the inputs of tasks back while they wait to run, marks inputs that no
queued task needs any more as first to evict, and shuts the IO pool down
when the worker closes::

    cluster = LocalCluster(data=spillbuffer.dask.data())
    client = Client(cluster)
    client.register_plugin(spillbuffer.dask.PrefetchPlugin())
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ._mapping import SpillBuffer

logger = logging.getLogger("spillbuffer.dask")

_DONE = frozenset({"memory", "error", "released", "forgotten", "cancelled"})
_QUEUED = frozenset({"ready", "constrained"})


def data(**options: Any) -> tuple:
    """The ``data=`` argument of a Dask worker that makes its ``data`` a
    ``SpillBuffer``. ``options`` are ``SpillBuffer``'s (``target``,
    ``limit``, ``max_spill``, ``compression``, ``io_threads``,
    ``write_headroom``, ``evict_in_flight``); ``target`` and ``max_spill`` default to what the
    worker would give its own spill buffer (``memory_limit`` times
    ``distributed.worker.memory.target``, and
    ``distributed.worker.memory.max-spill``). ``compression`` defaults to
    ``None`` here, as a worker's own (lz4 only if the ``lz4`` package is
    installed): arrays of floats rarely compress, and trying costs an
    extra buffer of the record's size per IO thread."""
    unknown = set(options) - {
        "target", "limit", "max_spill", "compression", "io_threads", "write_headroom", "evict_in_flight"
    }
    if unknown:
        raise TypeError(f"unknown SpillBuffer options: {', '.join(sorted(unknown))}")
    return (worker_buffer, options)


def _memory_manager():
    """The worker's memory manager calling the factory, found on the stack:
    the factory is given the local directory but not the memory limit,
    which the manager has already parsed when it builds ``data``."""
    from distributed.worker_memory import WorkerMemoryManager

    frame = inspect.currentframe()
    try:
        for _ in range(6):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            me = frame.f_locals.get("self")
            if isinstance(me, WorkerMemoryManager):
                return me
        return None
    finally:
        del frame


def _process_memory() -> int:
    """Resident memory of this process now (the worker before any data)."""
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # psutil is a dependency of distributed; be safe anyway
        return 0


def worker_buffer(worker_local_directory: str, **options: Any) -> SpillBuffer:
    """Build a worker's ``SpillBuffer`` under its local directory (the
    callable of ``data()``)."""
    manager = _memory_manager()
    if "target" not in options:
        limit = getattr(manager, "memory_limit", None)
        fraction = getattr(manager, "memory_target_fraction", None) or getattr(
            manager, "memory_spill_fraction", None
        )
        if limit and fraction:
            # The worker's memory monitor holds *process* memory to this
            # fraction of the limit (it evicts above the spill threshold
            # until process memory is back under it); aim managed memory
            # at what leaves room for the process's own, so that the
            # buffer's eviction and the monitor's do not fight.
            options["target"] = max(int(limit * fraction) - _process_memory(), int(limit * fraction) // 2)
        else:
            # No memory limit: spill only when told to (evict()).
            options["target"] = 1 << 62
            logger.info("worker has no memory limit: spillbuffer spills only on evict()")
    options.setdefault("compression", None)
    options.setdefault("write_headroom", True)
    if "max_spill" not in options and manager is not None:
        options["max_spill"] = manager.max_spill
    return SpillBuffer(os.path.join(worker_local_directory, "spillbuffer"), **options)


class PrefetchPlugin(WorkerPlugin):
    """Reads the inputs of a task back on the IO pool as soon as the task
    is ready to run, so that ``execute`` finds them in memory instead of
    waiting for a disk read on the event loop; when a task finishes, marks
    the inputs no other queued task of this worker needs as first to evict
    (a value read back is then dropped at once, having a disk copy). Closes
    the buffer (stopping its IO threads) on worker teardown.

    A no-op on a worker whose ``data`` is not a ``SpillBuffer``."""

    name = "spillbuffer-prefetch"

    def __init__(self, lookahead: int = 2) -> None:
        #: Ready tasks whose inputs are asked for again when one finishes.
        self.lookahead = lookahead
        self.worker = None
        self.buffer: SpillBuffer | None = None

    def setup(self, worker) -> None:
        self.worker = worker
        buf = worker.data
        if isinstance(buf, SpillBuffer):
            self.buffer = buf
        else:
            logger.warning("worker %s: data is a %s, not a spillbuffer.SpillBuffer; prefetch is off", worker.address, type(buf).__name__)

    def transition(self, key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        buf = self.buffer
        if buf is None:
            return
        ts = self.worker.state.tasks.get(key)
        if ts is None:
            return
        if finish in _QUEUED:
            inputs = [dep.key for dep in ts.dependencies if dep.state == "memory"]
            if inputs:
                buf.prefetch(inputs)
        elif start == "executing" and finish in _DONE:
            for dep in ts.dependencies:
                if all(d.state in _DONE for d in dep.dependents):
                    buf.consume(dep.key)
            # A prefetch never evicts, so those asked for when the tasks
            # became ready found no room if memory was full; a consumed
            # input read back has just made room: ask again for the next
            # tasks' inputs, in the order the worker will run them.
            inputs = [
                dep.key
                for nxt in self.worker.state.ready.peekn(self.lookahead)
                for dep in nxt.dependencies
                if dep.state == "memory"
            ]
            if inputs:
                buf.prefetch(inputs)

    def teardown(self, worker) -> None:
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
