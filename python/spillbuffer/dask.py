"""Turning spillbuffer on in a Dask cluster.

``data()`` is what a worker takes as ``data=`` (``Worker``, ``Nanny``,
``LocalCluster``, ``dask worker --data``...): a ``(callable, kwargs)`` pair,
picklable for nanny processes, whose callable builds a ``SpillBuffer`` in
the worker's local directory. ``PrefetchPlugin`` is a worker plugin that
reads the inputs of tasks back while they wait to run, and off the event
loop before they run, marks inputs that no queued task needs any more as
first to evict, and shuts the IO pool down when the worker closes::

    cluster = LocalCluster(data=spillbuffer.dask.data())
    client = Client(cluster)
    client.register_plugin(spillbuffer.dask.PrefetchPlugin())
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ._mapping import SpillBuffer
from ._peers import PeerServer

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
    ``distributed.worker.memory.max-spill``); ``compression`` follows
    ``distributed.worker.memory.spill-compression``, as ``SpillBuffer``'s
    own default does."""
    unknown = set(options) - {
        "target", "limit", "max_spill", "compression", "io_threads", "write_headroom", "evict_in_flight"
    }
    if unknown:
        raise TypeError(f"unknown SpillBuffer options: {', '.join(sorted(unknown))}")
    return (worker_buffer, options)


def _memory_manager():
    """The worker's memory manager calling the factory, and the worker it
    is built for, found on the stack: the factory is given the local
    directory but not the memory limit, which the manager has already
    parsed when it builds ``data``. ``(None, None)`` elsewhere."""
    from distributed.worker_memory import WorkerMemoryManager

    frame = inspect.currentframe()
    try:
        for _ in range(8):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None, None
            me = frame.f_locals.get("self")
            if isinstance(me, WorkerMemoryManager):
                return me, frame.f_locals.get("worker")
        return None, None
    finally:
        del frame


def follow_memory_monitor(buffer: SpillBuffer, worker=None) -> None:
    """Tell ``buffer`` how far process memory is over what the worker's
    memory monitor evicts down to (``SpillBuffer.memory_over``), so that
    ``evict()`` keeps exactly that much being written. ``worker`` defaults
    to the one whose memory manager is building ``buffer`` (found on the
    stack); without one this does nothing. ``worker_buffer`` calls it."""
    if worker is None:
        worker = _memory_manager()[1]
    if worker is None:
        return
    ref = weakref.ref(worker)

    def memory_over() -> int | None:
        w = ref()
        manager = getattr(w, "memory_manager", None)
        monitor = getattr(w, "monitor", None)
        limit = getattr(manager, "memory_limit", None)
        # What the monitor evicts down to (WorkerMemoryManager._spill).
        fraction = getattr(manager, "memory_target_fraction", None) or getattr(
            manager, "memory_spill_fraction", None
        )
        if not limit or not fraction or monitor is None:
            return None
        return monitor.get_process_memory() - int(limit * fraction)

    buffer.memory_over = memory_over


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
    manager, worker = _memory_manager()
    limit = getattr(manager, "memory_limit", None)
    if "target" not in options:
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
    spill = getattr(manager, "memory_spill_fraction", None)
    pause = getattr(manager, "memory_pause_fraction", None) or spill
    if "limit" not in options and limit and spill and options["target"] < (1 << 62):
        # Back-pressure: data[k] = v waits (GIL released) for writes in
        # flight while what the buffer holds passes the managed share of
        # the point halfway between the spill and pause thresholds.
        # Between the target and there, writes run behind the inserts and
        # the event loop never waits; beyond it the producer is held as
        # synchronous spilling would hold it, before the pause threshold
        # and far from the terminate one (docs/dask.md, "Memory bounds").
        # At the spill threshold itself, the seed scenario's persist had
        # the loop wait for writes of its 64 MiB chunks, in gaps of up to
        # 0.3 s.
        fraction = (spill + max(pause, spill)) / 2
        options["limit"] = max(options["target"], int(limit * fraction) - _process_memory())
    options.setdefault("write_headroom", True)
    if "max_spill" not in options and manager is not None:
        options["max_spill"] = manager.max_spill
    buffer = SpillBuffer(os.path.join(worker_local_directory, "spillbuffer"), **options)
    follow_memory_monitor(buffer, worker)
    return buffer


class PrefetchPlugin(WorkerPlugin):
    """Keeps disk reads of task inputs off the worker's event loop.

    - When a task becomes ready to run, and when the task before it starts,
      asks the buffer to read the inputs of the next ``lookahead`` ready
      tasks back on its IO pool (within the memory target), unless process
      memory is over the worker's target fraction: reads ahead then wait
      until memory is back under it, and the IO pool meanwhile takes
      queued writes before reads (``SpillBuffer.set_writes_first``).
    - A worker's ``execute`` gathers a task's inputs with ``data[key]`` on
      the event loop, which would wait there for a read not finished yet.
      The plugin wraps the worker's ``execute``: inputs still on disk are
      read first on a thread of the plugin's own (joining a prefetch in
      flight) and pinned in memory while the loop goes on; then
      ``execute`` runs and finds them there. (A read that fails is left
      to ``execute``, which reports it as it would.)
    - Answers peers' ``get_data`` with values on disk as they were
      stored: read on the IO pool, never deserialized here
      (``spillbuffer._peers``).
    - When a task finishes, marks each input that no other queued task of
      this worker needs as first to evict (a value read back is then
      dropped at once, having a disk copy).
    - Closes the buffer (stopping its IO threads) on worker teardown.

    A no-op on a worker whose ``data`` is not a ``SpillBuffer``."""

    name = "spillbuffer-prefetch"

    def __init__(self, lookahead: int = 2) -> None:
        #: Ready tasks whose inputs are asked for when one starts or ends.
        self.lookahead = lookahead
        self.worker = None
        self.buffer: SpillBuffer | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._execute = None
        #: Seconds a reading of process memory stands for (``_memory_high``).
        self.memory_every = 0.05
        self._memory_checked = float("-inf")
        self._memory_was_high = False
        self._peers: PeerServer | None = None

    def setup(self, worker) -> None:
        self.worker = worker
        buf = worker.data
        if not isinstance(buf, SpillBuffer):
            logger.warning("worker %s: data is a %s, not a spillbuffer.SpillBuffer; prefetch is off", worker.address, type(buf).__name__)
            return
        self.buffer = buf
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="spillbuffer-inputs")
        # The state machine looks `execute` up on the worker for each task.
        self._execute = worker.execute
        worker.execute = self._execute_with_inputs_in_memory
        # Peers are sent values on disk as stored, never deserialized here.
        self._peers = PeerServer(worker, buf)

    async def _execute_with_inputs_in_memory(self, key, *, stimulus_id: str):
        held = None
        try:
            buf, ts = self.buffer, self.worker.state.tasks.get(key)
            if buf is not None and ts is not None:
                on_disk = [dep.key for dep in ts.dependencies if dep.key in buf and not buf.in_memory(dep.key)]
                if on_disk:
                    loop = asyncio.get_running_loop()
                    held = await loop.run_in_executor(self._reader, buf.hold, on_disk)
        except Exception:  # never fail a task here: execute reads what is missing itself
            logger.debug("reading the inputs of %r ahead of execute failed", key, exc_info=True)
        try:
            return await self._execute(key, stimulus_id=stimulus_id)
        finally:
            if held is not None:
                held.release()

    def _memory_high(self) -> bool:
        """Is process memory over the worker's target fraction (where its
        memory monitor evicts)? No read-ahead then, and the IO pool writes
        first. Process memory is read at most every ``memory_every``
        seconds: on a workload of many small tasks, a read of /proc on
        every transition added up to seconds of the event loop's time."""
        now = time.monotonic()
        if now - self._memory_checked < self.memory_every:
            return self._memory_was_high
        self._memory_checked = now
        manager = getattr(self.worker, "memory_manager", None)
        limit = getattr(manager, "memory_limit", None)
        fraction = getattr(manager, "memory_target_fraction", None) or getattr(
            manager, "memory_spill_fraction", None
        )
        if not limit or not fraction:
            self._memory_was_high = False
            return False
        try:
            memory = self.worker.monitor.get_process_memory()
        except Exception:  # an older or stubbed monitor: no gate
            memory = 0
        high = memory > limit * fraction
        if high != self._memory_was_high and self.buffer is not None:
            # Above the target, a write that lands gives memory back and a
            # read takes more: the IO pool writes first.
            try:
                self.buffer.set_writes_first(high)
            except RuntimeError:  # closed under a worker shutting down
                pass
        self._memory_was_high = high
        return high

    def _prefetch(self, inputs: list) -> None:
        if inputs and not self._memory_high():
            self.buffer.prefetch(inputs)

    def _prefetch_next(self) -> None:
        inputs = [
            dep.key
            for nxt in self.worker.state.ready.peekn(self.lookahead)
            for dep in nxt.dependencies
            if dep.state == "memory"
        ]
        self._prefetch(inputs)

    def transition(self, key, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        buf = self.buffer
        if buf is None:
            return
        ts = self.worker.state.tasks.get(key)
        if ts is None:
            return
        if finish in _QUEUED:
            inputs = [dep.key for dep in ts.dependencies if dep.state == "memory"]
            self._prefetch(inputs)
        elif finish == "executing":
            # The next tasks' inputs are read while this one runs.
            self._prefetch_next()
        elif start == "executing" and finish in _DONE:
            for dep in ts.dependencies:
                if all(d.state in _DONE for d in dep.dependents):
                    buf.consume(dep.key)
            # Consumed inputs read back have just made room: ask again for
            # the next tasks' inputs, in the order the worker will run them.
            self._prefetch_next()

    def teardown(self, worker) -> None:
        if self._execute is not None and getattr(worker, "execute", None) == self._execute_with_inputs_in_memory:
            worker.execute = self._execute
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)
            self._reader = None
        if self._peers is not None:
            self._peers.remove()
            self._peers = None
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None
