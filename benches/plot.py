#!/usr/bin/env python3
"""Plot spill and unspill throughput against the raw limit measured in the
same run, from the JSON lines of `cargo run --release --example bench`.

    cargo run --release --example bench > results.jsonl
    python3 benches/plot.py results.jsonl plot.png

Needs matplotlib (`pip install matplotlib`).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def size_label(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "-"
    out = sys.argv[2] if len(sys.argv) > 2 else "plot.png"
    lines = open(src) if src != "-" else sys.stdin
    rows = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        if d["workload"].startswith(("spill", "unspill")):
            rows.append(d)
    if not rows:
        sys.exit("no spill/unspill lines in the input")
    # "unspill-pipelined-seq" -> "unspill\npipelined-seq": short lines.
    labels = [
        f'{r["workload"].replace("-", chr(10), 1)}\n{size_label(r["value_bytes"])}'
        for r in rows
    ]
    own = [r["throughput_bytes_per_s"] / 1e9 for r in rows]
    raw = [r["raw_figure"] / 1e9 for r in rows]
    # The checked floor of a read (fresh Vec + CRC per piece), where known.
    floor = [r.get("raw_fresh_vec_crc_bytes_per_s", 0) / 1e9 for r in rows]
    x = range(len(rows))
    w = 0.27
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=80)
    ax.bar([i - w for i in x], own, w, label="spillbuffer", color="#1f77b4")
    ax.bar(list(x), raw, w, label="raw write()/pread() into a reused buffer, same run", color="#bbbbbb")
    if any(floor):
        ax.bar([i + w for i in x], floor, w,
               label="pread() into a fresh Vec + CRC per piece (the checked floor)", color="#ff9f4a")
    for i, r in enumerate(rows):
        ax.text(i - w, own[i], f'{r["ratio"]:.2f}x', ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("GB/s (value bytes)")
    ax.set_title("Spill and unspill throughput against the raw limit (median of runs)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
