"""Where a py-spy profile's time went: each function's share of the samples whose stack holds it.

    python benchmarks/stacks.py worker.raw                 # the 40 largest shares
    python benchmarks/stacks.py worker.raw --under TuneController.step --top 60

Reads py-spy's raw (collapsed) format: one `frame;frame;... count` line per distinct stack, as
`benchmarks/service_overhead.py --py-spy OUT` writes it. A function counts once per sample however
deep it recurses. `--under NAME` keeps only the samples whose stack holds NAME, and gives shares of those.
"""

from __future__ import annotations

import argparse
from collections import Counter


def shares(lines: list[str], under: str | None = None) -> tuple[int, Counter[str]]:
    total, inclusive = 0, Counter[str]()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack:
            continue
        names = [frame.split(" (")[0] for frame in stack.split(";")]
        if under is not None and under not in names:
            continue
        total += int(count)
        for name in set(names):
            inclusive[name] += int(count)
    return total, inclusive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", help="py-spy raw output")
    parser.add_argument("--under", help="only the samples whose stack holds this function (py-spy's name)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with open(args.raw) as f:
        total, inclusive = shares(f.readlines(), args.under)
    print(f"{total} samples{f' under {args.under}' if args.under else ''}")
    for name, n in inclusive.most_common(args.top):
        print(f"{n / max(total, 1) * 100:5.1f}%  {name}")


if __name__ == "__main__":
    main()
