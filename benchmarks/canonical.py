"""Which record each benchmark suite's figures come from.

The benchmark page's summary and plots (`benchmarks.summary`,
`benchmarks.plots`) and the figures the guides quote (`benchmarks.figures`)
all read the records `pick` returns, so they never disagree:

- a suite run (`python -m benchmarks --suite=NAME`, `__main__.SUITES`) is
  its suite's record: the one record whose `meta.command` names the suite.
  Two records of one suite are an error: replace the old one.
- one host: no suite runs the single-process groups yet, and records carry
  no date, so `SINGLE_HOST_RECORD` names the record read until one does.

>>> meta = {"command": "python -m benchmarks --suite=hosts --noprogress"}
>>> suite_of(records.Run(meta, {}, [], []))
'hosts'
>>> suite_of(records.Run({"command": "python -m benchmarks"}, {}, [], []))
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence

from benchmarks import records

HOSTS = "hosts"
SINGLE_HOST = "single_host"
# The newest single-host record (by the commit that added it) that times
# every device count of the default run, 2, 4 and 8: autotune_bert, made
# 44 minutes later, left 8 devices out for memory and times one workload.
SINGLE_HOST_RECORD = "autotune248"
_SUITE_FLAG = re.compile(r"--suite=(\w+)")


class CanonicalError(ValueError):
    """A suite has no record, or more than one."""


@dataclasses.dataclass(frozen=True)
class Canonical:
    """One suite's record.

    Attributes:
        suite: HOSTS, SINGLE_HOST or another `--suite` name.
        name: the record's file name without `.json`.
        run: the record.
        why: how it was picked, a sentence for the page.
    """

    suite: str
    name: str
    run: records.Run
    why: str


def suite_of(run: records.Run) -> str | None:
    """The suite whose command made `run`, if one did."""
    found = _SUITE_FLAG.search(str(run.meta.get("command", "")))
    return found[1] if found else None


def pick(runs: Sequence[tuple[str, records.Run]]) -> dict[str, Canonical]:
    """Each suite's record among (name, record) pairs.

    Raises:
        CanonicalError: two records of one suite, or no SINGLE_HOST_RECORD.
    """
    out: dict[str, Canonical] = {}
    for name, run in runs:
        suite = suite_of(run)
        if suite is None:
            continue
        if suite in out:
            raise CanonicalError(
                f"two records of --suite={suite}: {out[suite].name} and "
                f"{name}; keep the newer one only"
            )
        why = f"the record of `python -m benchmarks --suite={suite}`"
        out[suite] = Canonical(suite, name, run, why)
    if SINGLE_HOST not in out:
        by_name = dict(runs)
        if SINGLE_HOST_RECORD not in by_name:
            raise CanonicalError(
                f"no record {SINGLE_HOST_RECORD}.json for one host "
                "(canonical.SINGLE_HOST_RECORD)"
            )
        why = (
            "no suite runs one host yet: the newest single-host record that "
            "times 2, 4 and 8 devices"
        )
        out[SINGLE_HOST] = Canonical(
            SINGLE_HOST, SINGLE_HOST_RECORD, by_name[SINGLE_HOST_RECORD], why
        )
    return out


def require(canonical: dict[str, Canonical], suite: str) -> Canonical:
    """`canonical[suite]`, or an error naming the suite."""
    if suite not in canonical:
        raise CanonicalError(
            f"no record of --suite={suite} in benchmarks/records/"
        )
    return canonical[suite]


def read(directory: pathlib.Path) -> list[tuple[str, records.Run]]:
    """Every `*.json` record of `directory`, by file name."""
    paths = sorted(directory.glob("*.json"))
    return [(p.stem, records.Run.read(p)) for p in paths]
