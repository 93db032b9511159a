#!/usr/bin/env python3
"""Wall-clock of `churn_count` (crates/floodgate/examples/churn_count.rs) built at two
commits, interleaved: every repetition runs each workload × storage on both binaries
in turn, so a host's slow spell falls on both. Prints median [min–max] in ms.

    python3 benches/churn-wall.py OLD_BINARY NEW_BINARY [REPS] [WORKLOAD ...]
"""
import statistics
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binaries = {"old": sys.argv[1], "new": sys.argv[2]}
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    workloads = sys.argv[4:] or ["churn", "flood", "known", "fill"]
    times = {}
    for _ in range(reps):
        for workload in workloads:
            for storage in ["heap", "inline"]:
                for name, binary in binaries.items():
                    start = time.perf_counter()
                    subprocess.run([binary, workload, storage], check=True,
                                   stdout=subprocess.DEVNULL)
                    elapsed = (time.perf_counter() - start) * 1000
                    times.setdefault((workload, storage), {}).setdefault(name, []).append(elapsed)
    print("| workload | storage | old, ms | new, ms | new ÷ old (medians) |")
    print("|---|---|---|---|---|")
    for (workload, storage), by in times.items():
        cell = {n: f"{statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}]" for n, v in by.items()}
        ratio = statistics.median(by["new"]) / statistics.median(by["old"])
        print(f"| {workload} | {storage} | {cell['old']} | {cell['new']} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
