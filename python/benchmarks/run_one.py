"""One run of one workload on a fresh ``LocalCluster``, in a process of its
own (the suite starts it, with a timeout, and kills its process group if
it hangs). Prints one JSON object with what was measured as its last line
of output.

    python run_one.py WORKLOAD MAPPING [--plugin on|off] [--seed N] [--option NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import dask

MIB = 1 << 20
CLUSTER = dict(n_workers=2, threads_per_worker=1, memory_limit="1GiB", processes=True)
# As benchmark suites set it: a task whose worker dies is not retried, so a
# lost worker fails the run instead of being recomputed.
BASE_CONFIG = {
    "distributed.scheduler.allowed-failures": 0,
    "distributed.worker.daemon": False,
}


def parse_options(pairs: list[str]) -> dict:
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--option {pair!r}: expected NAME=VALUE")
        try:
            options[name] = json.loads(value)
        except ValueError:
            options[name] = value
    return options


def run(workload_name: str, mapping: str, plugin: bool, seed: int, options: dict, timeout: float,
        gap_stacks: bool = False) -> dict:
    from distributed import Client, LocalCluster

    import spillbuffer
    import spillbuffer.dask

    from probe import LoopProbe, LostWorkers, MemorySampler, read_probes
    from workloads import WORKLOADS

    workload = WORKLOADS[workload_name]
    out = {"workload": workload_name, "mapping": mapping, "plugin": plugin if mapping == "spillbuffer" else None,
           "seed": seed, "options": options if mapping == "spillbuffer" else {}, "ok": False, "error": None}
    probes = tempfile.mkdtemp(prefix="suite-probe-")
    data = spillbuffer.dask.data(**options) if mapping == "spillbuffer" else None
    try:
        with dask.config.set({**BASE_CONFIG, **workload.config}):
            with LocalCluster(**CLUSTER, data=data, dashboard_address=":0", silence_logs=logging.WARNING) as cluster, \
                    Client(cluster) as client:
                lost = LostWorkers()
                cluster.scheduler.add_plugin(lost)
                client.register_plugin(LoopProbe(probes, gap_stacks))
                if mapping == "spillbuffer" and plugin:
                    client.register_plugin(spillbuffer.dask.PrefetchPlugin())
                if workload.config:
                    # What the workers run with (set before they started).
                    keys = list(workload.config)
                    out["worker_config"] = sorted({json.dumps(v) for v in client.run(
                        lambda: [dask.config.get(k) for k in keys]).values()})
                sampler = MemorySampler(cluster)
                # Warm up: imports and first-task costs are not what is measured.
                client.submit(sum, [1, 2], pure=False).result()
                workload.warmup(client)
                start = time.monotonic()
                sampler.recording = lost.recording = True
                try:
                    result = _with_deadline(lambda: workload.run(client, seed), timeout)
                    problem = workload.check(result)
                    out["result"] = result
                    out["ok"] = problem is None
                    out["error"] = problem and f"wrong result: {problem}"
                except Exception as e:  # a failed run is a measurement, not a crash of the suite
                    out["error"] = f"{type(e).__name__}: {e}"[:500]
                end = time.monotonic()
                sampler.recording = lost.recording = False
                out["wall_s"] = end - start
                # The probes write every 0.5 s: let the last window close.
                time.sleep(0.7)
                measured = read_probes(probes, start, end)
                out.update(_figures(measured, sampler, lost))
                if gap_stacks:
                    out["gap_stacks"] = {p["address"]: p["stacks"] for p in measured}
                sampler.close()
    finally:
        shutil.rmtree(probes, ignore_errors=True)
    return out


def _with_deadline(fn, seconds: float):
    """``fn()`` in a thread; a ``TimeoutError`` if it takes longer (the
    thread is left behind: the cluster is closed after, or the suite
    kills this process)."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout=max(seconds, 1))
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"workload still running after {seconds:.0f} s") from None
    finally:
        pool.shutdown(wait=False)


def _figures(probes: list[dict], sampler, lost) -> dict:
    """Per worker slot (a nanny, whose worker may have been restarted)."""
    rss = {name: s for name, s in sampler.samples.items() if s}
    by_address = {}
    for p in probes:
        by_address.setdefault(p["address"], []).append(p)
    gaps_per_process = [p["gaps"] for p in probes]
    all_gaps = [g for gs in gaps_per_process for g in gs]
    slots = max(len(rss), 2)
    return {
        "workers_lost": len(lost.removed),
        "restarts": sum(len(p) - 1 for p in sampler.pids.values()),
        "pauses": sum(p["pauses"] for p in probes),
        "paused_s": sum(p["paused_s"] for p in probes),
        # Per worker: the sum over both workers' processes, over the slots.
        "loop_gaps_s_per_worker": sum(all_gaps) / slots,
        "loop_gaps": len(all_gaps),
        "longest_gap_s": max(all_gaps, default=0.0),
        "mean_rss_mib": statistics.fmean(statistics.fmean(s) for s in rss.values()) / MIB if rss else None,
        "peak_rss_mib": max(max(s) for s in rss.values()) / MIB if rss else None,
        "written_mib": sum(p["metrics"]["disk-write-bytes"] for p in probes) / MIB,
        "read_mib": sum(p["metrics"]["disk-read-bytes"] for p in probes) / MIB,
        "peer_disk_mib": sum(p["metrics"].get("peer_disk_bytes_total", 0) for p in probes) / MIB,
        "peer_disk_records": int(sum(p["metrics"].get("peer_disk_count_total", 0) for p in probes)),
        "peer_deserialized_mib": sum(p["metrics"].get("peer_deserialized_bytes_total", 0) for p in probes) / MIB,
        "peer_loop_reads": int(sum(p["metrics"].get("peer_loop_reads_total", 0) for p in probes)),
        "writes": int(sum(p["metrics"]["disk-write-count"] for p in probes)),
        "reads": int(sum(p["metrics"]["disk-read-count"] for p in probes)),
        "worker_processes": len(probes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload")
    ap.add_argument("mapping", choices=["stock", "spillbuffer"])
    ap.add_argument("--plugin", choices=["on", "off"], default="on")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--gap-stacks", action="store_true",
                    help="sample each worker's event-loop thread while the loop is late; print the stacks")
    ap.add_argument("--timeout", type=float, default=300, help="seconds the workload may take (the cluster's start excluded)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        out = run(args.workload, args.mapping, args.plugin == "on", args.seed, parse_options(args.option), args.timeout,
                  args.gap_stacks)
    except Exception as e:
        traceback.print_exc()
        out = {"workload": args.workload, "mapping": args.mapping, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
