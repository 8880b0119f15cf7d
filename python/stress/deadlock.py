"""Mixed operations on one SpillBuffer from several threads, for a while,
under a watchdog: a hang (a lock-order inversion between the GIL and a lock
of the buffer, say) dumps every thread's Python stack and exits with
status 1 instead of waiting for ever.

    python python/stress/deadlock.py --seconds 600 --threads 4

``--threads 1`` runs the single-thread loop that used to hang (inserts and
reads of a few dozen keys, values of 8 KiB to 2 MiB around a 4 MiB target);
with more threads each one also deletes, evicts and flushes. Each thread
checks the values of its own keys against a dict. The test suite runs both
forms for a minute (tests/test_deadlock.py).
"""

from __future__ import annotations

import argparse
import faulthandler
import random
import sys
import tempfile
import threading
import time

import numpy as np

import spillbuffer

#: A thread that makes no progress for this long is taken as hung.
STALL_SECONDS = 20.0


def single(buf: spillbuffer.SpillBuffer, seed: int, deadline: float, progress: list, slot: int) -> None:
    """The loop of the report: inserts and reads, nothing else."""
    rnd = random.Random(seed)
    mine: dict = {}
    while time.monotonic() < deadline:
        k = ("t", seed, rnd.randrange(50))
        if rnd.random() < 0.5:
            v = np.full(rnd.choice([1 << 10, 1 << 16, 1 << 18]), rnd.random())
            buf[k] = v
            mine[k] = v
        elif k in mine:
            assert np.array_equal(buf[k], mine[k]), k
        progress[slot] += 1


def mixed(buf: spillbuffer.SpillBuffer, seed: int, deadline: float, progress: list, slot: int) -> None:
    """Inserts, reads, deletes, evict() and flush(), on keys of its own."""
    rnd = random.Random(seed)
    mine: dict = {}
    while time.monotonic() < deadline:
        k = ("m", seed, rnd.randrange(50))
        r = rnd.random()
        if r < 0.4:
            v = np.full(rnd.choice([1 << 10, 1 << 16, 1 << 18]), rnd.random())
            buf[k] = v
            mine[k] = v
        elif r < 0.75:
            if k in mine:
                assert np.array_equal(buf[k], mine[k]), k
        elif r < 0.9:
            if mine.pop(k, None) is not None:
                del buf[k]
        elif r < 0.98:
            buf.evict()
        else:
            buf.flush()
        progress[slot] += 1
    for k, v in mine.items():
        assert np.array_equal(buf[k], v), k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    # The watchdog is faulthandler's own thread, which needs no GIL: if the
    # threads below stop (holding the GIL or not), nobody re-arms it, and
    # it dumps every thread's stack and exits.
    faulthandler.dump_traceback_later(STALL_SECONDS, exit=True)
    buf = spillbuffer.SpillBuffer(tempfile.mkdtemp(prefix="sb-stress-"), target=4 << 20)
    deadline = time.monotonic() + args.seconds
    progress = [0] * args.threads
    failures: list = []
    body = single if args.threads == 1 else mixed

    def run(slot: int) -> None:
        try:
            body(buf, args.seed * 1000 + slot, deadline, progress, slot)
        except BaseException as e:  # reported by the main thread
            failures.append((slot, e))
            raise

    threads = [threading.Thread(target=run, args=(i,), name=f"stress-{i}") for i in range(args.threads)]
    for t in threads:
        t.start()
    last = list(progress)
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        # Re-arm only while every live thread moves.
        moving = all(p != q or not t.is_alive() for p, q, t in zip(progress, last, threads))
        if moving:
            faulthandler.dump_traceback_later(STALL_SECONDS, exit=True)
        last = list(progress)
    faulthandler.cancel_dump_traceback_later()
    for t in threads:
        t.join()
    buf.flush()
    stats = buf.stats()
    buf.close()
    print(
        f"ops={sum(progress)} threads={args.threads} seconds={args.seconds:g} "
        f"spilled={stats['spill_count_total']} unspilled={stats['unspill_count_total']}"
    )
    if failures:
        for slot, e in failures:
            print(f"thread {slot} failed: {e!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
