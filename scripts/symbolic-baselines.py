"""The rules that learn nothing, scored on a symbolic sweep's test split without training a model.

    .venv/bin/python scripts/symbolic-baselines.py sweeps/symbolic_prop.yaml
    .venv/bin/python scripts/symbolic-baselines.py sweeps/symbolic_prop.yaml derived=true test_examples=1000

Reads the sweep's fixed params (name=value arguments override them), builds its data exactly as a trial does
(jobs.symbolic.sets.make_data: the same data_seed, the same split) and prints the share of test formulas each
baseline's witness satisfies, checked as a model's prediction is: the constants (all_false, all_true,
constant_best: the per-formula better of the two, picked with the answer in hand) and the witness rules that
read the formula (polarity). Use it to choose a protocol where learning is needed before running the sweep.
"""

from __future__ import annotations

import sys
import time

import yaml

from jobs.registry import get_task
from jobs.symbolic.ltl import LTL
from jobs.symbolic.metrics import constant_baselines
from jobs.symbolic.prop import PROP
from jobs.symbolic.sets import make_data


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    spec = yaml.safe_load(open(argv[0]))
    data = {"symbolic.prop": PROP, "symbolic.ltl": LTL}.get(spec["task"])
    if data is None:
        print(f"error: {argv[0]} is a {spec['task']} sweep; give a symbolic.prop or symbolic.ltl one", file=sys.stderr)
        return 2
    params = dict(spec.get("params") or {})
    for arg in argv[1:]:
        name, sep, value = arg.partition("=")
        if not sep:
            print(f"error: {arg!r}: overrides are name=value", file=sys.stderr)
            return 2
        params[name] = yaml.safe_load(value)
    cfg = get_task(spec["task"]).make_config(params)
    started = time.perf_counter()
    train, test = make_data(cfg, data)
    scores = constant_baselines(test, data.constant, data.check, data.rules)
    took = time.perf_counter() - started
    print(f"{spec['task']}: {len(test)} test formulas ({len(train)} train), data in {took:.0f} s")
    for name, value in scores.items():
        print(f"  baseline/{name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
