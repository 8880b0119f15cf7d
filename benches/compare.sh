#!/usr/bin/env bash
# Run examples/bench.rs of two builds workload by workload, alternating, so
# that both see the same machine state. Usage:
#   benches/compare.sh BEFORE_BIN AFTER_BIN OUT_PREFIX [bench flags...]
set -euo pipefail
before=$1 after=$2 out=$3
shift 3
: > "$out-before.jsonl"
: > "$out-after.jsonl"
for w in metadata hit get insert spill unspill; do
  "$before" --workload "$w" "$@" >> "$out-before.jsonl"
  "$after" --workload "$w" "$@" >> "$out-after.jsonl"
done
# The hit path on a hot key (one per thread), after only.
"$after" --workload hit --hit-keys 2 "$@" >> "$out-after-hot.jsonl"
