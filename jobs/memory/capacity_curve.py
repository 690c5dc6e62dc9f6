"""Capacity read off a recall curve, shared by the memory tasks (memory.capacity, memory.hopfield).

A capacity curve is (load N, recall at N) for the loads a trial measured; N* is defined once here so that
both tasks, their summaries and their baselines count it the same way.
"""

from __future__ import annotations


def capacity_from_curve(loads: list[int], recalls: list[float], threshold: float) -> int:
    """N*: the largest load whose recall, and every smaller load's, is >= threshold (0 if the first fails)."""
    best = 0
    for n, r in sorted(zip(loads, recalls, strict=True)):
        if r < threshold:
            break
        best = n
    return best
