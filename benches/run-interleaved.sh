#!/usr/bin/env bash
# Runs the benchmark suites RUNS times, interleaved (suite A, suite B, …, then again),
# keeps each run's criterion medians, and prints a Markdown table of the median and
# min–max over the runs with ratios against the floor, governor and the mutex twin.
#
#   benches/run-interleaved.sh [RUNS] [-- CRITERION_ARGS...]
#
#   RUNS            how many times to run every suite (default 3)
#   CRITERION_ARGS  passed to every run, e.g. -- --warm-up-time 1 --measurement-time 2
#   SUITES          env: the [[bench]] targets to run (default "gcra")
#   BENCH_OUT       env: where logs, per-run JSON and table.md go
#                   (default target/bench-runs/<UTC timestamp>)
#
# The table (table.md) is what BENCHMARKS.md is generated from. Interleaving spreads
# slow drifts of a shared machine (thermal, neighbours) over every contender instead
# of penalising whichever ran last; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=3
if [[ $# -gt 0 && $1 != -- ]]; then
  RUNS=$1
  shift
fi
if [[ $# -gt 0 && $1 == -- ]]; then
  shift
fi
if ! [[ $RUNS =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [RUNS] [-- CRITERION_ARGS...]  (RUNS must be a positive whole number)" >&2
  exit 2
fi

SUITES=${SUITES:-matrix}
TARGET=${CARGO_TARGET_DIR:-target}
OUT=${BENCH_OUT:-$TARGET/bench-runs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"

bench_args=()
for suite in $SUITES; do
  bench_args+=(--bench "$suite")
done

# Build once, outside the measured runs.
cargo bench -p floodgate-benches "${bench_args[@]}" --no-run

for ((run = 1; run <= RUNS; run++)); do
  label=$(printf 'run-%02d' "$run")
  since=$(date +%s.%N)
  for suite in $SUITES; do
    echo "=== $label: $suite" >&2
    cargo bench -q -p floodgate-benches --bench "$suite" -- --noplot "$@" \
      | tee -a "$OUT/$label.log"
  done
  python3 benches/bench-table.py collect "$TARGET/criterion" --since "$since" \
    --label "$label" >"$OUT/$label.json"
done

python3 benches/bench-table.py table "$OUT"/run-*.json | tee "$OUT/table.md"
echo "=== written: $OUT/table.md (per-run medians: $OUT/run-*.json)" >&2
