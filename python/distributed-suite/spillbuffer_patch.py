"""pytest plugin: run distributed's own worker-memory tests against
spillbuffer.

Loaded with ``-p spillbuffer_patch`` (see ``run.sh``). It replaces the
class the worker builds for its ``data`` (``distributed.worker_memory.
SpillBuffer``) by ``spillbuffer.SpillBuffer`` following the worker's memory
monitor (``spillbuffer.dask.follow_memory_monitor``), and skips, by name and with
the reason, the tests that assert distributed's synchronous spilling
itself: behaviour this mapping replaces on purpose (docs/dask.md).

Environment:
    SPILLBUFFER_PATCH=0          run against distributed's own SpillBuffer
    SPILLBUFFER_RUN_SKIPPED=1    run the skipped tests too (they fail)
    SPILLBUFFER_COMPRESSION=X    pass compression=X to the mapping
"""

from __future__ import annotations

import os

import pytest

import distributed.worker_memory
import spillbuffer
import spillbuffer.dask

PATCHED = os.environ.get("SPILLBUFFER_PATCH", "1") == "1"

if PATCHED:
    _options = {}
    if os.environ.get("SPILLBUFFER_COMPRESSION"):
        _options["compression"] = os.environ["SPILLBUFFER_COMPRESSION"]

    def _worker_spill_buffer(*args, **kwargs):
        # What the worker would build, following its memory monitor as the
        # factory of spillbuffer.dask.data() does.
        buffer = spillbuffer.SpillBuffer(*args, **kwargs, **_options)
        spillbuffer.dask.follow_memory_monitor(buffer)
        return buffer

    distributed.worker_memory.SpillBuffer = _worker_spill_buffer

# Test node id (without parameters) -> why it cannot pass against a mapping
# that spills off the event loop.
SYNCHRONOUS = {
    "distributed/tests/test_worker_memory.py::test_fail_to_pickle_execute_1": (
        "asserts that a value failing to pickle raises inside data[k] = v; "
        "spillbuffer serializes later on its IO pool, keeps the value in "
        "memory (nothing inserted is lost) and logs the failure on "
        "distributed.spill"
    ),
    "distributed/tests/test_worker_memory.py::test_fail_to_pickle_execute_2": (
        "asserts that after a value fails to pickle, the next value inserted "
        "stays in memory too (synchronous spilling gives up on that insert); "
        "spillbuffer goes on to write the next value, which keeps memory "
        "within the target: the better behaviour, kept on purpose"
    ),
    "distributed/tests/test_worker_memory.py::test_release_evloop_while_spilling": (
        "asserts that the event loop is blocked in slices while slow values "
        "are spilled; spillbuffer never blocks the loop to spill"
    ),
    "distributed/tests/test_worker_metrics.py::test_task_lifecycle": (
        "asserts disk-write metrics inside the execute and gather-dep "
        "contexts of the inserts that spilled; spillbuffer's writes land on "
        "its IO pool after the insert returns and are reported to the "
        "context of the next mapping call"
    ),
}


def pytest_report_header(config):
    which = "spillbuffer.SpillBuffer" if PATCHED else "distributed's own SpillBuffer"
    return f"worker data mapping: {which}"


def pytest_collection_modifyitems(config, items):
    if not PATCHED or os.environ.get("SPILLBUFFER_RUN_SKIPPED") == "1":
        return
    for item in items:
        reason = SYNCHRONOUS.get(item.nodeid.split("[")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"synchronous spilling: {reason}"))
