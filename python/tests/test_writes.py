"""No more written than needed: a value released before its write ran is
not written."""

import numpy as np


def arrays(count, size=1 << 20):
    """Incompressible arrays of `size` bytes."""
    return [np.random.default_rng(i).random(size // 8) for i in range(count)]


def test_values_deleted_right_after_insert_never_reach_the_disk(make):
    # Each insert passes the target (eviction queues a write of the least
    # recently used value: this one, or the one before); the delete that
    # follows cancels it.
    buf = make(target=1 << 20, limit=64 << 20)
    for i, v in enumerate(arrays(64)):
        buf[i] = v
        del buf[i]
    buf.flush()
    s = buf.stats()
    assert s["spilled_bytes_total"] == 0 and s["spill_count_total"] == 0, s
    assert s["disk_bytes"] == 0, s


def test_released_values_whose_writes_are_queued_are_not_written(make):
    # 64 MiB inserted over an 8 MiB target: writes of 56 MiB are queued
    # behind the inserts (the limit leaves them room). Releasing everything
    # cancels those that have not started; at most one per IO thread may be
    # running and finish.
    io_threads = 2
    buf = make(target=8 << 20, limit=128 << 20, io_threads=io_threads, compression=None)
    values = arrays(64)
    for i, v in enumerate(values):
        buf[i] = v
    before = buf.stats()["spilled_bytes_total"]
    for i in range(len(values)):
        del buf[i]
    buf.flush()
    s = buf.stats()
    assert s["spilled_bytes_total"] <= before + io_threads * ((1 << 20) + 4096), (before, s)
    assert s["disk_bytes"] == 0, s
