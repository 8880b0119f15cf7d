"""The seed scenario on a real Dask cluster: distributed's own SpillBuffer
and spillbuffer side by side, in one run.

2 workers x 1 thread, 1 GiB memory limit each; a 3 GiB array of
da.random.random in 64 MiB chunks is persisted (most of it spills), then
summed (most of it is read back). For each data mapping and phase it
prints wall time, event-loop time lost in gaps over 100 ms, the number of
such gaps and the longest one (a ticker on each worker's loop), peak and
mean process memory (sampled from a thread, so a blocked loop does not
hide its peaks), bytes written and read by the mapping, and bytes written
more than once.

    python/test.sh --co -q >/dev/null    # once: builds python/.venv
    python/.venv/bin/python examples/dask_seed.py [--rounds N] [--json FILE]
    python/.venv/bin/python examples/dask_seed.py --report FILE   # summary of a --json file

Needs spillbuffer (pip install ./python), dask[array], distributed, psutil.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict

import dask
import dask.array as da
import distributed
import psutil
from distributed import Client, LocalCluster, wait
from distributed.diagnostics.plugin import WorkerPlugin

import spillbuffer
import spillbuffer.dask

GIB = 1 << 30
MIB = 1 << 20
ARRAY_BYTES = 3 * GIB
CHUNK_BYTES = 64 * MIB
MEMORY_LIMIT = GIB
TICK = 0.005  # the loop ticker's sleep
GAP = 0.1  # a gap is a tick later than this
SAMPLE = 0.02  # memory sampling period


class Probe(WorkerPlugin):
    """On each worker: a ticker on the event loop (gaps over 100 ms), a
    thread sampling process memory, and, for distributed's SpillBuffer, a
    count of writes per key."""

    name = "seed-probe"

    def __init__(self, gap_stacks: bool = False):
        self.gap_stacks = gap_stacks

    def setup(self, worker):
        self.worker = worker
        self.proc = psutil.Process()
        self.reset()
        self.running = True
        self.loop_thread = threading.get_ident()
        self.last_tick = time.monotonic()
        self.task = asyncio.get_running_loop().create_task(self.tick())
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.sampler.start()
        if self.gap_stacks:
            self.watchdog = threading.Thread(target=self.watch, daemon=True)
            self.watchdog.start()
        self.writes = defaultdict(list)  # key -> bytes of each write
        self.patch_stock_writes()

    def reset(self):
        self.gaps = []
        self.rss = []
        self.stacks = Counter()  # the loop thread's stack during gaps -> samples

    async def tick(self):
        last = time.monotonic()
        while self.running:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            if now - last > GAP:
                self.gaps.append(now - last)
            last = self.last_tick = now

    def watch(self):
        """While the loop is late by more than half a gap, sample what its
        thread runs every 10 ms (--gap-stacks). A thread waiting for the GIL
        shows the line it waits on; this thread needs the GIL too, so a gap
        in which nothing was sampled is one where some thread held it."""
        while self.running:
            time.sleep(0.01)
            if time.monotonic() - self.last_tick < GAP / 2:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            if frame is None:
                continue
            lines = traceback.extract_stack(frame)[-8:]
            self.stacks[" <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(lines))] += 1

    def sample(self):
        while self.running:
            self.rss.append(self.proc.memory_info().rss)
            time.sleep(SAMPLE)

    def patch_stock_writes(self):
        from distributed.spill import Slow

        if getattr(Slow, "_seed_patched", False):
            return
        original = Slow.__setitem__
        probe = self

        def setitem(slow, key, value):
            original(slow, key, value)
            probe.writes[key].append(slow.weight_by_key[key].disk)

        Slow.__setitem__ = setitem
        Slow._seed_patched = True

    def phase(self):
        """What happened since the last call; then start afresh."""
        data = self.worker.data
        m = dict(data.cumulative_metrics)
        out = {
            "gaps": list(self.gaps),
            "rss": list(self.rss),
            "written": m.get(("disk-write", "bytes"), 0),
            "read": m.get(("disk-read", "bytes"), 0),
            "stacks": dict(self.stacks.most_common(12)),
        }
        if isinstance(data, spillbuffer.SpillBuffer):
            s = data.stats()
            again = max(s["spill_count_total"] - s["serialized_count_total"], 0) + s["compacted_count_total"]
            per = s["spilled_bytes_total"] / s["spill_count_total"] if s["spill_count_total"] else 0
            out["written_again"] = again * per
            out["demand_reads"] = data._demand_reads
            out["hits"] = data._memory_reads

        else:
            out["written_again"] = sum(sum(w[1:]) for w in self.writes.values())
        self.reset()
        return out

    def teardown(self, worker):
        self.running = False


def phase_of(dask_worker):
    return dask_worker.plugins[Probe.name].phase()


def run(kind: str, options: dict, gap_stacks: bool = False) -> dict:
    """One cluster, both phases. Returns per-phase figures per worker."""
    data = spillbuffer.dask.data(**options) if kind == "spillbuffer" else None
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        memory_limit=MEMORY_LIMIT,
        processes=True,
        data=data,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    ) as cluster, Client(cluster) as client:
        client.register_plugin(Probe(gap_stacks))
        if kind == "spillbuffer":
            client.register_plugin(spillbuffer.dask.PrefetchPlugin())
        # Warm up: imports and first-task costs are not what is measured.
        da.ones(10, chunks=5).sum().compute()
        client.run(phase_of)  # start clean
        n = ARRAY_BYTES // 8
        x = da.random.random(n, chunks=CHUNK_BYTES // 8)
        phases = {}
        start = time.perf_counter()
        x = x.persist()
        wait(x)
        # Written counters are cumulative: keep the totals of each phase.
        phases["persist"] = (time.perf_counter() - start, client.run(phase_of))
        start = time.perf_counter()
        total = x.sum().compute()
        phases["reduce"] = (time.perf_counter() - start, client.run(phase_of))
        assert abs(total / n - 0.5) < 0.001, total
        return phases


def summarize(kind: str, phases: dict) -> list[dict]:
    rows = []
    prev_written = defaultdict(float)
    prev_read = defaultdict(float)
    prev_again = defaultdict(float)
    for name, (wall, per_worker) in phases.items():
        gaps_lost, gaps_n, longest, peaks, means = [], [], [], [], []
        written = read = again = 0.0
        for addr, w in per_worker.items():
            gaps_lost.append(sum(w["gaps"]))
            gaps_n.append(len(w["gaps"]))
            longest.append(max(w["gaps"], default=0.0))
            peaks.append(max(w["rss"], default=0))
            means.append(statistics.fmean(w["rss"]) if w["rss"] else 0)
            written += w["written"] - prev_written[addr]
            read += w["read"] - prev_read[addr]
            again += w["written_again"] - prev_again[addr]
            prev_written[addr], prev_read[addr], prev_again[addr] = w["written"], w["read"], w["written_again"]
        stacks = Counter()
        for w in per_worker.values():
            stacks.update(w.get("stacks", {}))
        rows.append(
            {
                "mapping": kind,
                "phase": name,
                "wall_s": round(wall, 2),
                "loop_lost_s_per_worker": [round(v, 2) for v in gaps_lost],
                "gaps_per_worker": gaps_n,
                "longest_gap_s_per_worker": [round(v, 3) for v in longest],
                "peak_rss_mib_per_worker": [round(v / MIB) for v in peaks],
                "mean_rss_mib_per_worker": [round(v / MIB) for v in means],
                "written_mib": round(written / MIB),
                "read_mib": round(read / MIB),
                "written_again_mib": round(again / MIB),
                **({"gap_stacks": dict(stacks.most_common(12))} if stacks else {}),
                **(
                    {"demand_reads_per_worker": [w["demand_reads"] for w in per_worker.values()],
                     "memory_hits_per_worker": [w["hits"] for w in per_worker.values()]}
                    if all("demand_reads" in w for w in per_worker.values()) else {}
                ),
            }
        )
    return rows


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'mapping':<12} {'phase':<8} {'wall s':>7} {'loop lost s':>12} {'gaps':>7} "
        f"{'longest s':>11} {'peak MiB':>11} {'mean MiB':>11} {'written':>8} {'read':>7} {'again':>6}"
    )
    print(head)
    for r in rows:
        pair = lambda v: "/".join(str(x) for x in v)  # noqa: E731
        print(
            f"{r['mapping']:<12} {r['phase']:<8} {r['wall_s']:>7} {pair(r['loop_lost_s_per_worker']):>12} "
            f"{pair(r['gaps_per_worker']):>7} {pair(r['longest_gap_s_per_worker']):>11} "
            f"{pair(r['peak_rss_mib_per_worker']):>11} {pair(r['mean_rss_mib_per_worker']):>11} "
            f"{r['written_mib']:>8} {r['read_mib']:>7} {r['written_again_mib']:>6}"
        )


def report(rows: list[dict]) -> None:
    """Markdown: each round's figures, spillbuffer against
    stock, then the median over rounds."""
    # Rounds with both mappings measured (an interrupted run may end with
    # one side only).
    rounds = sorted(
        {r["round"] for r in rows if r["mapping"] == "stock"} & {r["round"] for r in rows if r["mapping"] == "spillbuffer"}
    )
    lines = []

    def figures(kind, r):
        got = {x["phase"]: x for x in rows if x["mapping"] == kind and x["round"] == r}
        p, d = got["persist"], got["reduce"]
        walls = p["wall_s"] + d["wall_s"]
        lost = [a + b for a, b in zip(p["loop_lost_s_per_worker"], d["loop_lost_s_per_worker"])]
        mean = sum(
            ph["wall_s"] * statistics.fmean(ph["mean_rss_mib_per_worker"]) for ph in (p, d)
        ) / walls
        return {
            "persist_s": p["wall_s"],
            "reduce_s": d["wall_s"],
            "total_s": round(walls, 2),
            "loop_lost_s": round(statistics.fmean(lost), 2),
            "gaps": statistics.fmean(a + b for a, b in zip(p["gaps_per_worker"], d["gaps_per_worker"])),
            "longest_s": max(p["longest_gap_s_per_worker"] + d["longest_gap_s_per_worker"]),
            "peak_mib": max(p["peak_rss_mib_per_worker"] + d["peak_rss_mib_per_worker"]),
            "mean_mib": round(mean),
            "written_mib": p["written_mib"] + d["written_mib"],
            "read_mib": p["read_mib"] + d["read_mib"],
            "again_mib": p["written_again_mib"] + d["written_again_mib"],
        }

    cols = list(figures("stock", rounds[0]).keys())
    lines.append("| round | mapping | " + " | ".join(cols) + " |")
    lines.append("|---" * (len(cols) + 2) + "|")
    per_round = []
    for r in rounds:
        st, sb = figures("stock", r), figures("spillbuffer", r)
        per_round.append((st, sb))
        for kind, f in (("stock", st), ("spillbuffer", sb)):
            lines.append(f"| {r} | {kind} | " + " | ".join(str(f[c]) for c in cols) + " |")
    print("\n".join(lines))
    print()
    print("| figure | per round | median | whole run |")
    print("|---|---|---|---|")

    def ratio(col):
        # None when stock has nothing to compare with (e.g. no gap at all).
        return lambda st, sb: sb[col] / st[col] if st[col] else None

    def of_sums(col):
        def whole(pairs):
            st = sum(p[0][col] for p in pairs)
            return sum(p[1][col] for p in pairs) / st if st else None

        return whole

    def most(col, side):
        return lambda pairs: max(p[side][col] for p in pairs)

    def total(col, side):
        return lambda pairs: sum(p[side][col] for p in pairs)

    checks = [
        ("loop time lost in gaps > 100 ms, spillbuffer / stock (per worker, both phases)",
         ratio("loop_lost_s"), of_sums("loop_lost_s")),
        ("longest gap, spillbuffer (s)", lambda st, sb: sb["longest_s"], most("longest_s", 1)),
        ("longest gap, stock (s)", lambda st, sb: st["longest_s"], most("longest_s", 0)),
        ("reduce wall, spillbuffer / stock", ratio("reduce_s"), of_sums("reduce_s")),
        ("total wall, spillbuffer / stock", ratio("total_s"), of_sums("total_s")),
        ("mean process memory, spillbuffer / stock", ratio("mean_mib"), of_sums("mean_mib")),
        ("bytes written more than once, spillbuffer (MiB)", lambda st, sb: sb["again_mib"],
         total("again_mib", 1)),
        ("bytes written more than once, stock (MiB)", lambda st, sb: st["again_mib"], total("again_mib", 0)),
    ]

    def fmt(v):
        return "–" if v is None else f"{v:.3g}"

    for name, f, whole in checks:
        vals = [f(st, sb) for st, sb in per_round]
        known = [v for v in vals if v is not None]
        med = statistics.median(known) if known else None
        print(f"| {name} | " + ", ".join(fmt(v) for v in vals) + f" | {fmt(med)} | {fmt(whole(per_round))} |")
    print()
    print("(– : stock had none, so no ratio; whole run: ratio of the sums over the rounds,")
    print(" or the largest / the sum for gaps and bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1, help="stock/spillbuffer pairs to run (alternating)")
    ap.add_argument("--json", help="append one JSON line per row to this file")
    ap.add_argument("--only", choices=["stock", "spillbuffer"], help="run one of the two")
    ap.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                    help="a spillbuffer.dask.data() option, e.g. compression=lz4 (repeatable)")
    ap.add_argument("--report", metavar="FILE", help="print the Markdown summary of a --json file and exit")
    ap.add_argument("--gap-stacks", action="store_true",
                    help="sample the event loop thread's stack during gaps and print the commonest")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            report([json.loads(line) for line in f if line.strip()])
        return
    options = {}
    for o in args.option:
        name, _, value = o.partition("=")
        options[name] = int(value) if value.isdigit() else value
    dask.config.set({"distributed.worker.daemon": False})
    print(
        f"# distributed {distributed.__version__}, spillbuffer {spillbuffer.__version__}, "
        f"python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / GIB:.0f} GiB RAM"
    )
    print("# per worker values are shown as worker1/worker2; written/read/again in MiB, both workers")
    rows = []
    for r in range(args.rounds):
        for kind in ("stock", "spillbuffer"):
            if args.only and kind != args.only:
                continue
            got = summarize(kind, run(kind, options, args.gap_stacks))
            for row in got:
                row["round"] = r
            rows += got
            if args.json:
                # Row by row, so that an interrupted run keeps what it measured.
                with open(args.json, "a") as f:
                    for row in got:
                        f.write(json.dumps(row) + "\n")
            print_table(got)
            for row in got:
                if "demand_reads_per_worker" in row:
                    print(f"  {row['phase']}: reads waited for / memory hits (cumulative, per worker): "
                          f"{row['demand_reads_per_worker']} / {row['memory_hits_per_worker']}")
                for stack, n in row.get("gap_stacks", {}).items():
                    print(f"  {row['phase']} gap samples {n:4}: {stack}")
    if not args.only:
        print()
        report(rows)


if __name__ == "__main__":
    main()
