#!/usr/bin/env python3
"""Wall-clock of `churn_count` (crates/floodgate/examples/churn_count.rs) built at
several commits, interleaved: every repetition runs each workload × storage on every
binary in turn, so a host's slow spell falls on all of them. Prints median [min–max]
in ms, and each binary's median ÷ the first one's.

    python3 benches/churn-wall.py NAME=BINARY NAME=BINARY [...] [--reps N] [WORKLOAD ...]
"""
import statistics
import subprocess
import sys
import time


def main():
    binaries, workloads, reps = {}, [], 5
    args = sys.argv[1:]
    while args:
        arg = args.pop(0)
        if arg == "--reps":
            reps = int(args.pop(0))
        elif "=" in arg:
            name, binary = arg.split("=", 1)
            binaries[name] = binary
        else:
            workloads.append(arg)
    if len(binaries) < 2 or reps < 1:
        sys.exit(__doc__)
    workloads = workloads or ["churn", "flood", "known", "fill"]
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
    names = list(binaries)
    print("| workload | storage | " + " | ".join(f"{n}, ms" for n in names)
          + " | " + " | ".join(f"{n} ÷ {names[0]}" for n in names[1:]) + " |")
    print("|---|---|" + "---|" * (2 * len(names) - 1))
    for (workload, storage), by in times.items():
        cells = [f"{statistics.median(by[n]):.1f} [{min(by[n]):.1f}–{max(by[n]):.1f}]" for n in names]
        base = statistics.median(by[names[0]])
        ratios = [f"{statistics.median(by[n]) / base:.3f}" for n in names[1:]]
        print(f"| {workload} | {storage} | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
