"""What the workload suite measures while a workload runs, and how.

- ``LoopProbe`` (a ``WorkerPlugin``): on each worker, a ticker on the event
  loop (5 ms sleeps) records every gap over 100 ms, the worker's status
  changes to and from ``paused``, and the data mapping's cumulative disk
  counters; with ``gap_stacks``, samples of the loop thread's stack while
  the loop is late (what ran during the gaps). Events carry
  ``time.monotonic()`` stamps (one clock for every process of the
  machine), so the orchestrator keeps those inside the workload's window. The probe writes its state to a file of its own
  (one per worker process) twice a second, from a thread (not the event
  loop), so the figures of a worker the nanny kills are kept.
- ``MemorySampler``: a thread of the orchestrating process that samples the
  resident memory of each nanny's worker process every 20 ms (from outside,
  so a worker whose loop or GIL is held does not hide its peaks, and a
  restarted worker's new process is followed).
- ``LostWorkers`` (a ``SchedulerPlugin`` on the in-process scheduler of a
  ``LocalCluster``): workers removed while the workload ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import traceback
from collections import Counter

import psutil
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

TICK = 0.005  # the ticker's sleep
GAP = 0.1  # a tick later than this is a gap
WRITE_EVERY = 0.5  # seconds between state files
SAMPLE = 0.02  # memory sampling period


class LoopProbe(WorkerPlugin):
    """Event-loop gaps, pauses and disk counters of one worker, written to
    ``<directory>/<pid>.json``."""

    name = "suite-loop-probe"

    def __init__(self, directory: str, gap_stacks: bool = False):
        self.directory = directory
        #: Sample the loop thread's stack every 10 ms while the loop is late
        #: (``run_one.py --gap-stacks``).
        self.gap_stacks = gap_stacks

    async def setup(self, worker):
        self.worker = worker
        self.path = os.path.join(self.directory, f"{os.getpid()}.json")
        self.gaps: list[tuple[float, float]] = []  # (end, length)
        self.pauses: list[tuple[float, float | None]] = []  # (start, end or None)
        self.running = True
        self._write_lock = threading.Lock()  # the writer thread's and teardown's
        self.last_tick = time.monotonic()
        self.samples: list[tuple[float, str]] = []  # (time, loop thread's stack) while late
        self.task = asyncio.get_running_loop().create_task(self._tick())
        threading.Thread(target=self._write_periodically, name="suite-probe-writer", daemon=True).start()
        if self.gap_stacks:
            self.loop_thread = threading.get_ident()
            threading.Thread(target=self._watch, name="suite-gap-stacks", daemon=True).start()

    def _watch(self):
        """While the loop is late by more than half a gap, record what its
        thread runs, every 10 ms. This thread needs the GIL too: a late
        stretch with no sample is one where another thread held it."""
        while self.running:
            time.sleep(0.01)
            if time.monotonic() - self.last_tick < GAP / 2:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            if frame is None:
                continue
            lines = traceback.extract_stack(frame)[-10:]
            del frame
            stack = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(lines))
            self.samples.append((time.monotonic(), stack))

    def _paused(self) -> bool:
        return getattr(self.worker.status, "name", str(self.worker.status)) == "paused"

    async def _tick(self):
        last = time.monotonic()
        while self.running:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            if now - last > GAP:
                self.gaps.append((now, now - last))
            last = self.last_tick = now
            paused = self._paused()
            if paused and (not self.pauses or self.pauses[-1][1] is not None):
                self.pauses.append((now, None))
            elif not paused and self.pauses and self.pauses[-1][1] is None:
                self.pauses[-1] = (self.pauses[-1][0], now)

    def _write_periodically(self):
        """The state file, from a thread of its own: a file written and
        renamed on the event loop waits for the disk, which the workloads
        keep busy, and would put the probe's own gaps in the figures."""
        while self.running:
            time.sleep(WRITE_EVERY)
            try:
                self.write()
            except Exception:  # a closing worker: the last file stands
                pass

    def metrics(self) -> dict:
        """The mapping's cumulative disk counters, as the worker reports them
        (``cumulative_metrics``: stock's ``SpillBuffer`` and spillbuffer's
        mapping both keep them)."""
        m = getattr(self.worker.data, "cumulative_metrics", None) or {}
        out = {}
        for activity in ("disk-write", "disk-read"):
            for unit in ("bytes", "count", "seconds"):
                out[f"{activity}-{unit}"] = float(m.get((activity, unit), 0.0))
        # spillbuffer's: what serving peers' get_data took.
        stats = getattr(self.worker.data, "stats", None)
        if callable(stats):
            s = stats()
            for name in PEER_STATS:
                out[name] = float(s.get(name, 0.0))
        return out

    def write(self) -> None:
        state = {
            "pid": os.getpid(),
            "address": self.worker.address,
            "mapping": type(self.worker.data).__module__ + "." + type(self.worker.data).__name__,
            "time": time.monotonic(),
            "gaps": list(self.gaps),
            "pauses": list(self.pauses),
            "metrics": self.metrics(),
            "samples": list(self.samples),
        }
        tmp = self.path + ".tmp"
        with self._write_lock:
            with open(tmp, "w") as f:
                json.dump(state, f)
            os.replace(tmp, self.path)

    def teardown(self, worker):
        self.running = False
        try:
            self.write()
        except Exception:  # teardown of a closing worker: the last periodic file stands
            pass


#: spillbuffer's figures of serving peers: records sent from disk as
#: stored, and what ``data[key]`` in ``get_data`` had to deserialize or
#: read on the event loop.
PEER_STATS = ("peer_disk_count_total", "peer_disk_bytes_total", "peer_deserialized_bytes_total", "peer_loop_reads_total")


def read_probes(directory: str, start: float, end: float) -> list[dict]:
    """Each worker process's figures inside ``[start, end]``."""
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name)) as f:
            s = json.load(f)
        gaps = [length for stop, length in s["gaps"] if start <= stop <= end + GAP]
        pauses = [(a, b if b is not None else end) for a, b in s["pauses"] if a <= end and (b is None or b >= start)]
        out.append(
            {
                "pid": s["pid"],
                "address": s["address"],
                "mapping": s["mapping"],
                "gaps": gaps,
                "pauses": len([a for a, _ in pauses if a >= start]),
                "paused_s": sum(min(b, end) - max(a, start) for a, b in pauses),
                "metrics": s["metrics"],
                "stacks": _gap_stacks(s.get("samples", []), s["gaps"], start, end),
            }
        )
    return out


def _gap_stacks(samples: list, gaps: list, start: float, end: float) -> dict:
    """The loop thread's stacks sampled inside the window: the commonest
    overall, and those of the five longest gaps (with their lengths)."""
    inside = [(t, st) for t, st in samples if start <= t <= end + GAP]
    if not inside:
        return {}
    longest = sorted(((length, stop) for stop, length in gaps if start <= stop <= end + GAP), reverse=True)[:5]
    return {
        "common": Counter(st for _, st in inside).most_common(15),
        "longest": [
            [length, Counter(st for t, st in inside if stop - length <= t <= stop).most_common(4)]
            for length, stop in longest
        ],
    }


class MemorySampler:
    """Resident memory of each nanny's worker process, sampled every 20 ms
    from a thread of this process while ``recording``."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.samples: dict[str, list[int]] = {}  # nanny name -> RSS samples
        self.pids: dict[str, set[int]] = {}  # nanny name -> worker pids seen
        self.recording = False
        self._stop = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._thread = threading.Thread(target=self._run, name="suite-memory-sampler", daemon=True)
        self._thread.start()

    def _rss(self, pid: int) -> int | None:
        try:
            proc = self._procs.get(pid)
            if proc is None:
                proc = self._procs[pid] = psutil.Process(pid)
            return proc.memory_info().rss
        except (psutil.Error, OSError):
            return None

    def _run(self):
        while not self._stop.wait(SAMPLE):
            if not self.recording:
                continue
            try:
                nannies = list(self.cluster.workers.items())
            except RuntimeError:  # changed by a restart on the cluster's loop
                continue
            for name, nanny in nannies:
                process = getattr(nanny, "process", None)
                pid = getattr(process, "pid", None)
                if pid is None:
                    continue
                rss = self._rss(pid)
                if rss is None:
                    continue
                self.samples.setdefault(str(name), []).append(rss)
                self.pids.setdefault(str(name), set()).add(pid)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=1)


class LostWorkers(SchedulerPlugin):
    """Workers the scheduler removed (a nanny restart, a crash) while
    ``recording``."""

    name = "suite-lost-workers"

    def __init__(self):
        self.recording = False
        self.removed: list[str] = []

    def remove_worker(self, scheduler, worker, **kwargs):
        if self.recording:
            self.removed.append(worker)
