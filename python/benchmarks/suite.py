"""The Dask workload suite: distributed's own spill buffer and spillbuffer
alternating on spilling workloads, each run on a fresh ``LocalCluster``
(2 workers × 1 thread, 1 GiB each, ``allowed-failures`` 0) in a process of
its own with a timeout, so a hung cluster fails its run, not the suite.

    pip install -r python/benchmarks/requirements.txt ./python
    python python/benchmarks/suite.py                     # every workload, 5 runs per mapping
    python python/benchmarks/suite.py --workload matmul-0.3 --runs 3 --plugin both --json out.jsonl
    python python/benchmarks/suite.py --report out.jsonl  # the tables of a --json file

Runs go round by round: in each round every workload runs once with each
mapping, the mappings' order reversed every other round, so that a change
of the machine's load falls on both. Prints a Markdown table per workload
summary (and the micro section's) at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from report import print_report  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

MICRO = "micro"
# Beyond a run's workload timeout: its cluster's start and close. A run
# process still there after that is killed with its process group.
GRACE = 120


def variants(mappings: list[str], plugin: str) -> list[tuple[str, str]]:
    """(mapping, plugin on/off) pairs to alternate."""
    out = []
    for m in mappings:
        if m == "stock":
            out.append(("stock", "on"))
        else:
            out += [("spillbuffer", p) for p in (["on", "off"] if plugin == "both" else [plugin])]
    return out


# Lines of a run's log worth counting: what the cluster said went wrong.
LOG_EVENTS = {
    "spill_failures": "Failed to pickle",  # a value the mapping could not serialize (kept in memory)
    "nanny_restarts": "exceeded 95% memory budget",
}


def log_events(path: str) -> dict:
    """Counts of LOG_EVENTS in a run's log, and its first error lines."""
    counts = dict.fromkeys(LOG_EVENTS, 0)
    excerpt = []
    with open(path, errors="replace") as f:
        for line in f:
            for name, needle in LOG_EVENTS.items():
                if needle in line:
                    counts[name] += 1
            if len(excerpt) < 4 and (" - ERROR - " in line or " - CRITICAL - " in line or "exceeded 95%" in line):
                excerpt.append(line.strip()[:300])
    return {"log_counts": counts, "log_excerpt": excerpt}


def run_one(workload: str, mapping: str, plugin: str, seed: int, options: list[str], timeout: float,
            log_dir: str | None) -> dict:
    """One run in a child process (its own session, so that a hang is ended
    by killing its whole process group: the cluster's workers too)."""
    cmd = [sys.executable, os.path.join(HERE, "run_one.py"), workload, mapping, "--plugin", plugin,
           "--seed", str(seed), "--timeout", str(timeout)]
    for o in options:
        cmd += ["--option", o]
    started = time.monotonic()
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%H%M%S")
    keep_log = log_dir is not None
    log_path = os.path.join(log_dir or tempfile.gettempdir(), f"suite-{stamp}-{os.getpid()}-{workload}-{mapping}-{plugin}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=timeout + GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            stdout = ""
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        hung = proc.returncode == -signal.SIGKILL
        out = {"workload": workload, "mapping": mapping, "plugin": plugin == "on", "ok": False,
               "error": f"hung: killed after {time.monotonic() - started:.0f} s" if hung
               else f"run exited {proc.returncode} without a result"}
    if proc.returncode not in (0, None) and out.get("ok"):
        out["ok"], out["error"] = False, f"run exited {proc.returncode}"
    out.update(log_events(log_path))
    if not keep_log:
        os.unlink(log_path)
        log_path = None
    out["log"] = log_path
    out["process_s"] = time.monotonic() - started
    return out


def native_digest() -> str:
    """The first hex digits of the installed native module's SHA-256: which
    build ran, when several are installed over time."""
    import hashlib

    import spillbuffer._native as native

    with open(native.__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="workloads:\n" + "\n".join(f"  {n}: {w.what}" for n, w in WORKLOADS.items())
                                 + f"\n  {MICRO}: resident b[k] and b[k] = v of a small array, per mapping")
    ap.add_argument("--workload", action="append", choices=[*WORKLOADS, MICRO],
                    help="a workload to run (repeatable; default: all)")
    ap.add_argument("--runs", type=int, default=5, help="runs per mapping and workload (default 5)")
    ap.add_argument("--mapping", action="append", choices=["stock", "spillbuffer"],
                    help="repeatable; default: both")
    ap.add_argument("--plugin", choices=["on", "off", "both"], default="on",
                    help="spillbuffer.dask.PrefetchPlugin on the spillbuffer runs (default on)")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a spillbuffer.dask.data() option (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300, help="seconds a workload may run (default 300)")
    ap.add_argument("--json", help="append one JSON line per run to this file")
    ap.add_argument("--logs", help="keep each run's log (the cluster's warnings) in this directory")
    ap.add_argument("--label", help="free text kept in the header (e.g. the build's commit)")
    ap.add_argument("--report", metavar="FILE", help="print the tables of a --json file and exit")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            print_report([json.loads(line) for line in f if line.strip()])
        return
    import dask
    import distributed
    import psutil

    import spillbuffer

    workloads = args.workload or [*WORKLOADS, MICRO]
    pairs = variants(args.mapping or ["stock", "spillbuffer"], args.plugin)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    header = {
        "suite": "dask-workloads",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]),
        "python": platform.python_version(),
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "spillbuffer": getattr(spillbuffer, "__version__", "?"),
        "spillbuffer_native_sha256": native_digest(),
        "cpus": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / (1 << 30)),
        "label": args.label,
    }
    print("# " + json.dumps(header), flush=True)
    rows = [header]

    def keep(row: dict) -> None:
        row["load"] = round(os.getloadavg()[0], 1)
        rows.append(row)
        if args.json:
            # Run by run, so an interrupted suite keeps what it measured.
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")

    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(header) + "\n")
    for r in range(args.runs):
        order = pairs if r % 2 == 0 else pairs[::-1]
        for workload in workloads:
            if workload == MICRO:
                if r == 0:  # one run measures every mapping side by side
                    from micro import run_micro

                    for row in run_micro():
                        keep(row)
                        print(f"micro {row['mapping']:<22} {row['op']:<10} {row['us_median']:.3f} µs", flush=True)
                continue
            for mapping, plugin in order:
                row = run_one(workload, mapping, plugin, args.seed, args.option, args.timeout, args.logs)
                row["run"] = r
                keep(row)
                print(f"run {r} {workload:<22} {mapping:<12} plugin={plugin:<3} "
                      f"{'ok' if row.get('ok') else 'FAILED'} wall={row.get('wall_s', float('nan')):.1f}s "
                      f"lost={row.get('workers_lost', '?')} pauses={row.get('pauses', '?')} "
                      f"gaps={row.get('loop_gaps_s_per_worker', float('nan')):.2f}s "
                      f"peak={row.get('peak_rss_mib') or float('nan'):.0f}MiB load={row['load']}"
                      + (f" error={row['error']}" if row.get("error") else ""), flush=True)
    print()
    print_report(rows)


if __name__ == "__main__":
    main()
