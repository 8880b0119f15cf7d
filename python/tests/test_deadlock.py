"""No hang between the GIL and the buffer's locks: mixed operations from one
and from four threads, for a minute each, in a subprocess whose watchdog
(faulthandler, which needs no GIL) dumps every thread's stack and exits if
the threads stop moving. A hang fails the test with those stacks.

The same script runs for longer by hand: ``python python/stress/deadlock.py
--seconds 600 --threads 4``."""

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "stress", "deadlock.py")
SECONDS = 60


@pytest.mark.parametrize("threads", [1, 4])
def test_no_hang(threads):
    try:
        done = subprocess.run(
            [sys.executable, SCRIPT, "--seconds", str(SECONDS), "--threads", str(threads)],
            capture_output=True,
            text=True,
            # The script's own watchdog ends a hang after 20 s without
            # progress; this bounds a watchdog that failed too.
            timeout=SECONDS + 120,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the stress run hung and its watchdog did not end it:\n{e.stderr}")
    assert done.returncode == 0, f"stress run failed (status {done.returncode}):\n{done.stdout}\n{done.stderr}"
    # It did spill and read back: the loop exercised the IO pool.
    fields = dict(f.split("=") for f in done.stdout.split())
    assert int(fields["spilled"]) > 0 and int(fields["unspilled"]) > 0, done.stdout
