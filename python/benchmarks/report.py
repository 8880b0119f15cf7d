"""The suite's Markdown tables, from its rows (as run, or read back from a
``--json`` file): per workload and mapping, the medians and ranges over
the runs, then the failed runs, then the micro section."""

from __future__ import annotations

import statistics


def label(row: dict) -> str:
    if row["mapping"] != "spillbuffer":
        return row["mapping"]
    return "spillbuffer" if row.get("plugin", True) else "spillbuffer, no plugin"


def _fmt(v, digits=3) -> str:
    if v is None:
        return "–"
    if isinstance(v, int) or abs(v) >= 100:
        return str(round(v))
    return f"{v:.{digits}g}"


def _median_range(values: list, digits=3) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return _fmt(med, digits)
    return f"{_fmt(med, digits)} ({_fmt(min(values), digits)}–{_fmt(max(values), digits)})"


def _median(values: list):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


COLUMNS = [
    "workload", "mapping", "ok", "wall s", "wall / stock", "pauses", "workers lost",
    "loop s in gaps > 100 ms (per worker)", "longest gap s", "mean RSS MiB", "peak RSS MiB",
    "written MiB", "read MiB", "values not spilled (serialization failed)",
]


def workload_table(runs: list[dict]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|---" * len(COLUMNS) + "|"]
    workloads = list(dict.fromkeys(r["workload"] for r in runs))
    for w in workloads:
        mine = [r for r in runs if r["workload"] == w]
        groups: dict[str, list[dict]] = {}
        for r in mine:
            groups.setdefault(label(r), []).append(r)
        stock_ok = [r["wall_s"] for r in groups.get("stock", []) if r.get("ok")]
        stock_wall = _median(stock_ok)
        for name, rs in groups.items():
            ok = [r for r in rs if r.get("ok")]
            # Figures of the runs that finished; of all runs when none did.
            fig = ok or rs
            star = "" if ok else " †"
            wall = _median([r["wall_s"] for r in ok]) if ok else None
            cells = [
                w,
                name,
                f"{len(ok)}/{len(rs)}",
                _median_range([r["wall_s"] for r in ok]) if ok else "–",
                _fmt(wall / stock_wall, 3) if wall and stock_wall and name != "stock" else "",
                _median_range([r.get("pauses") for r in fig]) + star,
                str(sum(r.get("workers_lost", 0) for r in rs)),
                _median_range([r.get("loop_gaps_s_per_worker") for r in fig], 2) + star,
                f"{_fmt(_median([r.get('longest_gap_s') for r in fig]), 2)} "
                f"(max {_fmt(max((r.get('longest_gap_s') or 0 for r in fig), default=None), 2)}){star}",
                _fmt(_median([r.get("mean_rss_mib") for r in fig]), 3) + star,
                f"{_fmt(_median([r.get('peak_rss_mib') for r in fig]), 3)} "
                f"(max {_fmt(max((r.get('peak_rss_mib') or 0 for r in fig), default=None), 3)}){star}",
                _median_range([r.get("written_mib") for r in fig], 4) + star,
                _median_range([r.get("read_mib") for r in fig], 4) + star,
                str(sum(r.get("log_counts", {}).get("spill_failures", 0) for r in rs)),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def failures(runs: list[dict]) -> list[str]:
    lines = []
    for r in runs:
        if r.get("ok"):
            continue
        error = str(r.get("error"))
        # KilledWorker's message goes on with advice after its first sentence.
        error = error.split(". Inspecting")[0].split(" The last worker")[0]
        lines.append(
            f"- {r['workload']}, {label(r)}, run {r.get('run', '?')}: {error} "
            f"(workers lost {r.get('workers_lost', '?')}, pauses {r.get('pauses', '?')}, "
            f"peak RSS {_fmt(r.get('peak_rss_mib'))} MiB, after {_fmt(r.get('wall_s'))} s)"
            + (f"; log {r['log']}" if r.get("log") else "")
        )
        lines += [f"  `{line[:200]}`" for line in r.get("log_excerpt", [])[:2]]
    return lines


def agreement(runs: list[dict]) -> list[str]:
    """Whether the runs of a workload that finished returned the same
    result: the largest difference between them, relative to the result."""
    lines = []
    for w in dict.fromkeys(r["workload"] for r in runs):
        results = [r["result"] for r in runs if r["workload"] == w and r.get("ok")]
        if len(results) < 2:
            continue
        flat = [x if isinstance(x, list) else [x] for x in results]
        spread = 0.0
        for i in range(len(flat[0])):
            vals = [f[i] for f in flat]
            scale = max(abs(v) for v in vals) or 1.0
            spread = max(spread, (max(vals) - min(vals)) / scale)
        lines.append(f"- {w}: {len(results)} results, largest relative difference {spread:.2g}")
    return lines


def peers_table(runs: list[dict]) -> list[str]:
    """spillbuffer's runs: what serving peers' ``get_data`` took (records
    sent from disk as stored; values deserialized, and reads on the event
    loop, to serve peers)."""
    runs = [r for r in runs if r.get("mapping") == "spillbuffer" and r.get("ok") and "peer_disk_mib" in r]
    if not runs:
        return []
    lines = ["| workload | mapping | records sent from disk as stored | MiB | MiB deserialized to serve peers "
             "| get_data reads on the event loop |", "|---|---|---|---|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in runs):
        groups: dict[str, list[dict]] = {}
        for r in runs:
            if r["workload"] == w:
                groups.setdefault(label(r), []).append(r)
        for name, rs in groups.items():
            lines.append(f"| {w} | {name} | {_median_range([r['peer_disk_records'] for r in rs])} | "
                         f"{_median_range([r['peer_disk_mib'] for r in rs], 4)} | "
                         f"{_fmt(max(r['peer_deserialized_mib'] for r in rs))} (max) | "
                         f"{max(r['peer_loop_reads'] for r in rs)} (max) |")
    return lines


def micro_table(rows: list[dict]) -> list[str]:
    lines = ["| op | mapping | µs per call, median (range) | / stock SpillBuffer | CPU µs per call, median |",
             "|---|---|---|---|---|"]
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        stock = next((r["us_median"] for r in mine if r["mapping"] == "stock SpillBuffer"), None)
        for r in mine:
            ratio = _fmt(r["us_median"] / stock, 3) if stock else "–"
            cpu = r.get("cpu_us_median")  # (absent from older files)
            lines.append(f"| {'`b[k]`' if op == 'get' else '`b[k] = v`'} | {r['mapping']} | "
                         f"{r['us_median']:.3f} ({r['us_min']:.3f}–{r['us_max']:.3f}) | {ratio} | "
                         f"{'–' if cpu is None else f'{cpu:.3f}'} |")
    return lines


def print_report(rows: list[dict]) -> None:
    headers = [r for r in rows if "suite" in r]
    micro = [r for r in rows if r.get("workload") == "micro"]
    runs = [r for r in rows if "suite" not in r and r.get("workload") != "micro"]
    for h in headers[:1]:
        print(f"{h['date']}, `{h['command']}`; python {h['python']}, dask {h['dask']}, distributed "
              f"{h['distributed']}, {h['cpus']} CPUs, {h['ram_gib']} GiB RAM"
              + (f"; {h['label']}" if h.get("label") else "")
              + (f"; native module sha256 {h['spillbuffer_native_sha256']}" if h.get("spillbuffer_native_sha256") else ""))
    loads = [r["load"] for r in rows if "load" in r]
    if loads:
        print(f"load average (1 min) at the end of each run: {min(loads)}–{max(loads)}, median {statistics.median(loads)}")
    print()
    if runs:
        table = workload_table(runs)
        print("\n".join(table))
        if any("†" in line for line in table):
            print()
            print("† no run finished: figures of the failed runs")
        peers = peers_table(runs)
        if peers:
            print()
            print("Serving peers (spillbuffer's get_data, both workers, per run):")
            print("\n".join(peers))
        agree = agreement(runs)
        if agree:
            print()
            print("Results of the finished runs:")
            print("\n".join(agree))
        fails = failures(runs)
        if fails:
            print()
            print("Failed runs:")
            print("\n".join(fails))
    if micro:
        print()
        print("\n".join(micro_table(micro)))
