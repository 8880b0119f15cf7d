#!/usr/bin/env python3
"""Print a Markdown table from the JSON lines of examples/bench.rs.

    python3 benches/table.py results.jsonl [before.jsonl]

With a second file, a "before" column is added (same workload and size).
"""
import json
import sys


def load(path):
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def key(r):
    return (r["workload"], r["value_bytes"], r["threads"], r.get("resident_keys"))


def size(n):
    if n >= 1 << 20:
        return f"{n >> 20} MiB"
    if n >= 1 << 10:
        return f"{n >> 10} KiB"
    return f"{n} B"


def figure(r):
    w = r["workload"]
    if w == "metadata":
        return f'{r["metadata_bytes_per_key"]:.1f} B/key'
    if w.startswith("hit"):
        return f'{r["p50_ns"]} ns p50, {r["ops_per_s"] / 1e6:.2f} M/s'
    if w == "insert":
        return f'{r["ops_per_s"] / 1e6:.2f} M/s'
    return f'{r["throughput_bytes_per_s"] / 1e9:.2f} GB/s'


def raw(r):
    w = r["workload"]
    if w == "metadata":
        return f'{r["raw_figure"]:.0f} B/key of values'
    if w.startswith("hit"):
        return f'{r["raw_figure"] / 1e6:.1f} M/s'
    if w == "insert":
        return f'{r["raw_figure"] / r["value_bytes"] / 1e6:.2f} M/s'
    return f'{r["raw_figure"] / 1e9:.2f} GB/s'


def ratio(r):
    w = r["workload"]
    if w == "metadata":
        return ""
    if w.startswith("hit"):
        return f'{r["scaling_vs_1_thread"]:.2f}x of 1 thread' if r["threads"] > 1 else ""
    p = r.get("ratio_paired_median")
    return f'{r["ratio"]:.2f}' + (f" (paired {p:.2f})" if p else "")


def main():
    rows = load(sys.argv[1])
    before = {key(r): r for r in load(sys.argv[2])} if len(sys.argv) > 2 else {}
    head = "| workload | value | threads | spillbuffer | p50 / p99 / p999 | raw baseline | ratio |"
    if before:
        head = "| workload | value | threads | before | after | p50 / p99 / p999 (after) | raw baseline | ratio |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        name = r["workload"]
        if r.get("resident_keys"):
            name += f' ({r["resident_keys"]} keys)'
        lat = f'{r["p50_ns"]} / {r["p99_ns"]} / {r["p999_ns"]} ns' if r["p50_ns"] else ""
        cells = [name, size(r["value_bytes"]), str(r["threads"])]
        if before:
            b = before.get(key(r))
            cells.append(figure(b) if b else "")
        cells += [figure(r), lat, raw(r), ratio(r)]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
