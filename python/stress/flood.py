"""A producer faster than the disk: one thread inserts ``--count`` arrays of
``--mib`` MiB into a SpillBuffer with a ``--target-mib`` target (its limit)
as fast as it can, then prints, as JSON, the process's peak resident
memory over its baseline (``ru_maxrss`` before and after) and the bound the
mapping promises: its limit plus ``io_threads + 1`` of its largest values.

    python python/stress/flood.py --count 128 --mib 16 --target-mib 64

tests/test_memory.py runs it and asserts the bound.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time

import numpy as np

import spillbuffer


def peak_rss() -> int:
    """Peak resident memory of this process so far, in bytes (Linux: KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=128)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--target-mib", type=int, default=64)
    ap.add_argument("--io-threads", type=int, default=2)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="sb-flood-") as d:
        buf = spillbuffer.SpillBuffer(d, target=args.target_mib << 20, io_threads=args.io_threads)
        # Warm up what the loop below uses, so that the baseline holds it.
        buf["warm"] = np.ones(1024)
        del buf["warm"]
        buf.flush()
        baseline = peak_rss()
        n = (args.mib << 20) // 8
        start = time.monotonic()
        for i in range(args.count):
            value = np.random.default_rng(i).random(n)
            value[-1] = i
            buf[("x", i)] = value
            del value
        inserted = time.monotonic() - start
        buf.flush()
        flushed = time.monotonic() - start
        peak = peak_rss()
        # Every value reads back right (a sample: reading all would only
        # measure the disk).
        for i in (0, args.count // 2, args.count - 1):
            assert buf[("x", i)][-1] == float(i)
        stats = buf.stats()
        largest = (args.mib << 20) + 200  # its sizeof: data plus the array object
        print(
            json.dumps(
                {
                    "over_baseline": peak - baseline,
                    "bound": (args.target_mib << 20) + (args.io_threads + 1) * largest,
                    "baseline": baseline,
                    "insert_seconds": round(inserted, 3),
                    "flush_seconds": round(flushed, 3),
                    "spilled_bytes_total": stats["spilled_bytes_total"],
                }
            )
        )
        buf.close()


if __name__ == "__main__":
    main()
