#!/usr/bin/env python3
"""Check that every figure in README.md's Performance section appears in BENCHMARKS.md.

Standard library only. Run from anywhere:

  benches/check-readme-figures.py            # exit 1 listing each figure not found
  benches/check-readme-figures.py --where    # also name, for every figure, the
                                             # BENCHMARKS.md sections that hold it

A figure is one of, in the Performance section (from its "## Performance" heading to
the next "## " heading):

  * a value with its range, "58.3 [57.7–73.9]" (a "×" after the value is allowed);
  * a decimal number, "188.8", "0.93×", "2.71×" (in prose and in table cells);
  * an integer with a unit: "330 ns", "2 %", "12 of 164".

Dates (2026-12-01), powers (10^6, 2^-40) and bare integers ("2 threads", "1M keys")
are not figures.

A figure is found when BENCHMARKS.md has it as a whole token: the same digits, not
inside a longer number. The "×" is optional on either side (BENCHMARKS.md's ratio
tables put it in the header), and bold markers between a value and its range
("**56.3** [56.0–57.6]") are ignored. An integer keeps its unit ("2 %" needs "2 %"
or "2%"). This is a necessary check, not a sufficient one: it cannot tell whether
the figure in BENCHMARKS.md was measured on the machine and with the command the
README names; `--where` lists the sections to read for that.
"""

import argparse
import os
import re
import sys

NUM = r"\d+(?:\.\d+)?"
DASH = "[–-]"  # an en dash, or a hyphen
# Not a figure: a digit after a letter or a caret (p99.9, 10^6, 2^-40), after a
# hyphen (-40), or inside a longer number.
BEFORE = r"(?<![\w.^\-])"
RANGE = re.compile(rf"{BEFORE}({NUM})×? \[({NUM}){DASH}({NUM})\]")
DECIMAL = re.compile(rf"{BEFORE}(\d+\.\d+)(?![\d.]\d)")
INT_UNIT = re.compile(rf"{BEFORE}(\d+) ?(%|ns\b|of \d+\b)")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def section(text, heading):
    """Lines (number, text) from the `## heading` line to the next `## ` heading."""
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if line.strip() == heading:
            start = i
            break
    if start is None:
        sys.exit(f"README.md has no '{heading}' heading")
    out = []
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("## "):
            break
        out.append((i + 1, lines[i]))
    return out


def paragraphs(lines):
    """Join wrapped lines into paragraphs, so that a figure broken over two lines
    ("77\nof 84") is read whole. A table row, a list item and a footnote (¹ ² ³) each
    start a paragraph. Yields (text, [(offset in text, line number)])."""
    out = []
    current = None
    for number, line in lines:
        text = line.strip()
        starts = not text or text.startswith(("|", "- ", "* ", "¹", "²", "³", "⁴"))
        if starts and current:
            out.append(current)
            current = None
        if not text:
            continue
        if current is None:
            current = (text, [(0, number)])
        else:
            joined = current[0] + " "
            current = (joined + text, current[1] + [(len(joined), number)])
        if text.startswith("|"):
            out.append(current)
            current = None
    if current:
        out.append(current)
    return out


def line_of(starts, offset):
    """The line number that holds `offset` of a paragraph."""
    number = starts[0][1]
    for start, n in starts:
        if start <= offset:
            number = n
    return number


def figures(lines):
    """Every figure of the lines: (line number, the figure as written, its pattern)."""
    found = []
    for text, starts in paragraphs(lines):
        # Blank out dates, keeping offsets.
        line = DATE.sub(lambda m: " " * len(m.group(0)), text)
        taken = []  # spans already part of a range figure
        for m in RANGE.finditer(line):
            value, low, high = m.groups()
            pattern = (
                rf"(?<![\d.]){re.escape(value)}(?:×|\*\*)? ?\*?\*? ?"
                rf"\[{re.escape(low)}{DASH}{re.escape(high)}\]"
            )
            found.append((line_of(starts, m.start()), f"{value} [{low}–{high}]", pattern))
            taken.append(m.span())
        for m in DECIMAL.finditer(line):
            if any(a <= m.start() < b for a, b in taken):
                continue
            value = m.group(1)
            found.append(
                (
                    line_of(starts, m.start()),
                    value,
                    rf"(?<![\d.]){re.escape(value)}(?![\d]|\.\d)",
                )
            )
        for m in INT_UNIT.finditer(line):
            if any(a <= m.start() < b for a, b in taken):
                continue
            value, unit = m.groups()
            found.append(
                (
                    line_of(starts, m.start()),
                    f"{value} {unit}",
                    rf"(?<![\d.]){value} ?{re.escape(unit)}",
                )
            )
    found.sort(key=lambda f: f[0])
    return found


def headings_of(text):
    """For each line of BENCHMARKS.md (0-based), the nearest heading above it."""
    heading = "(top)"
    out = []
    for line in text.splitlines():
        if re.match(r"#{2,4} ", line):
            heading = line.lstrip("#").strip()
        out.append(heading)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=os.path.join(root, "README.md"))
    parser.add_argument("--benchmarks", default=os.path.join(root, "BENCHMARKS.md"))
    parser.add_argument("--heading", default="## Performance")
    parser.add_argument(
        "--where", action="store_true", help="name the sections that hold each figure"
    )
    args = parser.parse_args()

    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()
    with open(args.benchmarks, encoding="utf-8") as f:
        benchmarks = f.read()
    bench_lines = benchmarks.splitlines()
    headings = headings_of(benchmarks)

    missing = []
    all_figures = figures(section(readme, args.heading))
    for number, shown, pattern in all_figures:
        rx = re.compile(pattern)
        hits = [i for i, line in enumerate(bench_lines) if rx.search(line)]
        if not hits:
            missing.append((number, shown))
        elif args.where:
            places = []
            for i in hits:
                if headings[i] not in places:
                    places.append(headings[i])
            print(f"README.md:{number}: {shown}")
            for place in places[:4]:
                print(f"    {place}")
            if len(places) > 4:
                print(f"    … and {len(places) - 4} more sections")

    print(
        f"{len(all_figures)} figures in README.md's Performance section, "
        f"{len(all_figures) - len(missing)} found in BENCHMARKS.md"
    )
    if missing:
        print("not in BENCHMARKS.md:")
        for number, shown in missing:
            print(f"  README.md:{number}: {shown}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
