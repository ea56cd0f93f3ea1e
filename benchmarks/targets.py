"""This project's targets (issue #12's ratios, quoted in README).

They are the study's business, not the library's: each compares our best
with a TensorFlow reference or the roofline, measured in the same run.
Figures come from the confirmation rounds where a group has them. A target
measured on a smaller stand-in (`--quick`'s truncated ResNet-50) says so;
an unmet one says what bounds it, from the same run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from benchmarks.records import Group, Target, ratio

# (workload, setting) -> [(what ours is compared with, threshold)];
# "roofline" is a fraction of the roofline, anything else is a reference
# entry's time over ours.
TARGETS = {
    ("resnet50", "single_process"): [("tf_best", 1.25), ("roofline", 0.8)],
    ("many_small", "single_process"): [
        ("TF ReductionToOneDevice", 10.0),
        ("TF HierarchicalCopy num_packs=1", 3.0),
    ],
    ("resnet50", "multi_worker"): [("TF MWMS default", 1.5)],
}
# The entries the confirmation rounds re-time besides each family's best.
REFERENCES = tuple(
    name
    for goals in TARGETS.values()
    for name, _ in goals
    if name not in ("tf_best", "roofline")
)


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds is not None else "-"


def evaluate(groups: Sequence[Group]) -> list[Target]:
    """The targets that apply to the groups measured.

    Single-process ResNet-50 counts at 4 devices (or any stand-in).
    """
    out = []
    for g in groups:
        base = re.sub(r"\[.*\]$", "", g.workload)
        stand_in = g.workload not in ("resnet50", "many_small")
        goals = TARGETS.get((base, g.setting), [])
        if base == "resnet50" and g.num_replicas != 4 and not stand_in:
            goals = []  # single process: the 4-device group counts
        ours, roof = g.time(g.ours_best), g.time(g.roofline)
        pack_unpack = next(
            (g.time(r.name) for r in g.results if r.family == "bound"), None
        )
        for reference, threshold in goals:
            if reference == "roofline":
                name = "ours best as a fraction of the roofline"
                measured = ratio(roof, ours)
                bound = str(g.roofline)
            else:
                other_name = g.tf_best if reference == "tf_best" else reference
                other = g.time(other_name)
                label = "TF best" if reference == "tf_best" else reference
                name = f"ours best vs {label}".replace("TF MWMS", "MWMS")
                measured = ratio(other, ours)
                bound = (
                    f"ours best {_ms(ours)} ({g.ours_best}), {other_name} "
                    f"{_ms(other)}, roofline {_ms(roof)} ({g.roofline})"
                )
                if pack_unpack is not None:
                    bound += (
                        f"; packing and unpacking alone take "
                        f"{_ms(pack_unpack)}, so a packing algorithm is at "
                        f"most {ratio(other, pack_unpack) or 0:.2f}x faster"
                    )
            met = measured is not None and measured >= threshold
            note = bound if not met or stand_in else ""
            if stand_in:
                note = f"measured on a stand-in (smaller) workload; {note}"
            name, note = f"{g.workload}, {g.scope}: {name}", note.strip("; ")
            out.append(Target(name, measured, threshold, met, stand_in, note))
    return out


def line(target: Target) -> str:
    """One target as the table and the Markdown summary print it."""
    shown = f"{target.measured:.2f}" if target.measured is not None else "n/a"
    verdict = "MET" if target.met else "NOT MET"
    text = f"{target.name}: {shown} (target >= {target.threshold:g}) {verdict}"
    return f"{text} - {target.note}" if target.note else text
