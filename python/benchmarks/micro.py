"""The suite's micro section: the cost of one call of the mapping a worker
makes most, on values that stay in memory, for spillbuffer's mapping,
distributed's ``SpillBuffer`` and a ``dict``, measured side by side in one
process (the mappings take turns in every repetition).

- ``get``: a resident ``b[k]`` (keys cycled over 1,000 held values);
- ``set``: ``b[k] = v`` of a small array (1 KiB of float64) replacing the
  key's value (the same 1,000 keys).

Per call: the median over the repetitions of a loop's time divided by its
calls (the loop's own overhead included, as for the ``dict``), in wall
time and in the thread's CPU time (``time.thread_time``): on a shared
machine the wall time of a loop includes the slices other processes ran
in, its CPU time does not (the mappings here never wait for anything).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time

import numpy as np

KEYS = 1000
CALLS = 50_000
REPEATS = 9
TARGET = 1 << 30  # nothing spills


def _mappings(directory: str) -> dict:
    from distributed.spill import SpillBuffer as StockSpillBuffer

    import spillbuffer

    return {
        "spillbuffer": spillbuffer.SpillBuffer(f"{directory}/sb", target=TARGET),
        "stock SpillBuffer": StockSpillBuffer(f"{directory}/stock", target=TARGET),
        "dict": {},
    }


def _time_get(b, keys) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.thread_time()
    for k in keys:
        b[k]
    return time.perf_counter() - start, time.thread_time() - cpu


def _time_set(b, keys, value) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.thread_time()
    for k in keys:
        b[k] = value
    return time.perf_counter() - start, time.thread_time() - cpu


def run_micro() -> list[dict]:
    directory = tempfile.mkdtemp(prefix="suite-micro-")
    try:
        maps = _mappings(directory)
        names = list(maps)
        key_set = [("x", i) for i in range(KEYS)]
        keys = [key_set[i % KEYS] for i in range(CALLS)]
        value = np.arange(128, dtype="float64")
        for b in maps.values():
            for k in key_set:
                b[k] = value.copy()
        per_call: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for rep in range(REPEATS):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order:
                b = maps[name]
                per_call.setdefault((name, "get"), []).append(_time_get(b, keys))
                per_call.setdefault((name, "set"), []).append(_time_set(b, keys, value))
        maps["spillbuffer"].close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    rows = []
    for (name, op), times in per_call.items():
        us = [wall / CALLS * 1e6 for wall, _ in times]
        cpu_us = [cpu / CALLS * 1e6 for _, cpu in times]
        rows.append({"workload": "micro", "mapping": name, "op": op, "us_median": statistics.median(us),
                     "us_min": min(us), "us_max": max(us), "cpu_us_median": statistics.median(cpu_us),
                     "calls": CALLS, "repeats": REPEATS})
    return rows
