"""Memory stays bounded under a producer faster than the disk: the flood
(128 arrays of 16 MiB into a 64 MiB target) peaks within the limit plus
io_threads + 1 of the largest values over the interpreter's baseline.
Measured in a subprocess (ru_maxrss before and after), by
python/stress/flood.py."""

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "stress", "flood.py")


def test_flood_peak_is_bounded():
    done = subprocess.run(
        [sys.executable, SCRIPT, "--count", "128", "--mib", "16", "--target-mib", "64"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    # Everything was written (2 GiB of incompressible arrays) ...
    assert got["spilled_bytes_total"] >= 120 * (16 << 20), got
    # ... while the process held no more than the bound.
    assert got["over_baseline"] <= got["bound"], got
