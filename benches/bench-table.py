#!/usr/bin/env python3
"""Turn criterion results from several interleaved runs into a Markdown table.

Standard library only. Two steps:

  bench-table.py collect TARGET/criterion --since EPOCH [--label NAME] > run.json
      Reads every <bench>/new/benchmark.json + estimates.json under the criterion
      directory written at or after EPOCH (seconds, as `date +%s.%N` prints) and
      writes {"label", "medians": {full_id: ns}}: criterion's median point estimate of
      the time per iteration, one number per benchmark for this run.

  bench-table.py table run1.json run2.json ...
      Prints, per case, each contender's median over the runs, the min-max over the
      runs, the throughput, and ratios against the floor, governor and the mutex twin,
      headed by the machine (CPU model, cores) the numbers come from.

Benchmark ids are `<group>/<case...>/<contender>`: the last component names the
contender; everything before it is the case, and ratios compare contenders within
one case. Ratios are time per decision divided by the reference's time per decision:
below 1.00 is faster (for throughput, read the inverse).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

# Contenders shown first, in this order; others follow alphabetically.
ORDER = ["floodgate", "mutex_twin", "textbook_mutex", "governor", "floor"]
# Ratio columns: (header, reference contender).
REFERENCES = [("× floor", "floor"), ("× governor", "governor"), ("× mutex twin", "mutex_twin")]


def collect(args):
    medians = {}
    for root, _dirs, files in os.walk(args.criterion_dir):
        if os.path.basename(root) != "new" or "benchmark.json" not in files:
            continue
        estimates = os.path.join(root, "estimates.json")
        if not os.path.exists(estimates) or os.path.getmtime(estimates) < args.since:
            continue  # stale: written by an earlier run or another suite
        with open(os.path.join(root, "benchmark.json")) as f:
            full_id = json.load(f)["full_id"]
        with open(estimates) as f:
            medians[full_id] = json.load(f)["median"]["point_estimate"]
    if not medians:
        sys.exit(f"no criterion results newer than {args.since} under {args.criterion_dir}")
    json.dump({"label": args.label, "medians": dict(sorted(medians.items()))}, sys.stdout, indent=1)
    print()


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def core_counts():
    """(physical cores, logical CPUs) from /proc/cpuinfo, falling back to os.cpu_count()."""
    logical = os.cpu_count() or 0
    cores = set()
    try:
        with open("/proc/cpuinfo") as f:
            physical_id = core_id = None
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    physical_id = value
                elif key == "core id":
                    core_id = value
                elif not key:  # end of one processor's block
                    if core_id is not None:
                        cores.add((physical_id, core_id))
                    physical_id = core_id = None
            if core_id is not None:
                cores.add((physical_id, core_id))
    except OSError:
        pass
    return (len(cores) or logical, logical)


def rustc_version():
    try:
        return subprocess.run(["rustc", "-V"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "rustc (unknown version)"


def fmt_ns(ns):
    return f"{ns:.2f}" if ns < 100 else f"{ns:.1f}"


def table(args):
    runs = []
    for path in args.runs:
        with open(path) as f:
            runs.append(json.load(f))
    # case -> contender -> [median of each run]
    cases = {}
    for run in runs:
        for full_id, ns in run["medians"].items():
            case, _, contender = full_id.rpartition("/")
            cases.setdefault(case, {}).setdefault(contender, []).append(ns)

    physical, logical = core_counts()
    out = []
    out.append(f"Machine: {cpu_model()}, {physical} cores ({logical} logical CPUs), "
               f"{platform.system()} {platform.release()}; {rustc_version()}.")
    out.append(f"{len(runs)} interleaved run(s) ({', '.join(r.get('label') or '?' for r in runs)}), "
               f"tabulated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    out.append("")
    out.append("Each run gives criterion's median time per decision; the table shows the median over "
               "the runs and the min–max over the runs. Ratios divide medians: below 1.00 is faster "
               "than the reference (for throughput, read the inverse). Contended cases report the "
               "time per decision of all threads together, so M decisions/s is the total.")
    for case in sorted(cases):
        contenders = cases[case]
        order = [c for c in ORDER if c in contenders] + sorted(c for c in contenders if c not in ORDER)
        medians = {c: statistics.median(contenders[c]) for c in order}
        refs = [(header, ref) for header, ref in REFERENCES if ref in medians]
        out.append("")
        out.append(f"### {case}")
        out.append("")
        header = ["contender", "ns/decision", "min–max", "M decisions/s"] + [h for h, _ in refs]
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
        for c in order:
            values = contenders[c]
            m = medians[c]
            row = [c, fmt_ns(m), f"{fmt_ns(min(values))}–{fmt_ns(max(values))}",
                   f"{1e3 / m:.1f}" if m > 0 else "—"]
            for _header, ref in refs:
                row.append("—" if ref == c or medians[ref] <= 0 else f"{m / medians[ref]:.2f}")
            if len(values) != len(runs):
                row[0] += f" ({len(values)}/{len(runs)} runs)"
            out.append("| " + " | ".join(row) + " |")
    print("\n".join(out))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="medians of one run, as JSON on stdout")
    c.add_argument("criterion_dir")
    c.add_argument("--since", type=float, default=0.0,
                   help="ignore results written before this Unix time (seconds)")
    c.add_argument("--label", default="")
    c.set_defaults(func=collect)
    t = sub.add_parser("table", help="Markdown table over several runs")
    t.add_argument("runs", nargs="+")
    t.set_defaults(func=table)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
