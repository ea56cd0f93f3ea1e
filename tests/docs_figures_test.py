"""The guides type no measured figure: the site build fills them.

A measured figure in a guide goes stale the day the benchmark runs again,
so the guides (docs/guides/*.md, and docs/index.md) quote them through a
`{{ figure(...) }}` placeholder that the site build fills from the
suites' records (`benchmarks.figures`).

The rule: a number followed by ms, x, ×, % or MiB (with or without a
space) is a measured figure, and fails this test, unless it is inside a
placeholder or the phrase around it matches one entry of ALLOWED. ALLOWED
holds only what is not a measurement: settings you pass or the library
fixes (pack and bucket sizes, the range a sweep was told to cover, a
tuning constant) and a bound computed from a formula on the page. Each
entry is a regular expression matched on the figure's line that must
cover the figure, with the reason it is not a measurement.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from benchmarks import figures

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [*sorted((REPO / "docs/guides").glob("*.md")), REPO / "docs/index.md"]
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|MiB|x|×|%)(?![A-Za-z0-9])"
)
ALLOWED = [
    (
        r"(?:packs? of|packs? gradients by) \d+ MiB"
        r"|\d+(?: (?:and|or) \d+)? MiB packs?",
        "a pack size is a setting (bytes_per_pack, "
        "packing.DEFAULT_BYTES_PER_PACK)",
    ),
    (
        r"buckets of \d+ MiB|\d+ MiB of gradients per bucket",
        "PowerSGD's bucket size is a setting (bucket_bytes)",
    ),
    (
        r"sweep from \d+ to \d+ MiB|\d+ B - \d+ MiB sweep",
        "the sizes a sweep was told to cover (its flags), not its results",
    ),
    (
        r"candidates within \d+% of the",
        "autotune's confirmation margin, a constant of tf_crossdevice.tuning",
    ),
    (
        r"that is \d\.\d% of sum\|x_i\|; with fp16 \d\.\d%",
        "the rounding bound of the formula above it (sum_tolerance), "
        "computed, not measured",
    ),
]


def measured_figures(text: str) -> list[str]:
    """Each figure outside placeholders and ALLOWED, as 'line N: figure'.

    >>> measured_figures("It takes 12 ms,\\nin packs of 2 MiB.\\n")
    ["line 1: '12 ms'"]
    >>> measured_figures('{{ figure("time", "x", 2) }}, 3.5x and 7×')
    ["line 1: '3.5x'", "line 1: '7×'"]
    >>> measured_figures("50% of 8MiB, in 0x1f")
    ["line 1: '50%'", "line 1: '8MiB'"]
    """
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = figures.PLACEHOLDER.sub("", line)
        allowed = [
            m.span()
            for pattern, _ in ALLOWED
            for m in re.finditer(pattern, line)
        ]
        for found in FIGURE.finditer(line):
            start, end = found.span()
            if not any(a <= start and end <= b for a, b in allowed):
                out.append(f"line {number}: {found[0]!r}")
    return out


@pytest.mark.parametrize(
    "page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES]
)
def test_no_measured_figure_is_typed_by_hand(page):
    assert measured_figures(page.read_text()) == [], (
        f"{page.relative_to(REPO)}: write measured figures as "
        '{{ figure("NAME", ...) }} (benchmarks/figures.py)'
    )


def test_every_allowed_phrase_is_used():
    """An entry no page needs any more is removed, not kept 'just in case'."""
    text = "\n".join(p.read_text() for p in PAGES)
    unused = [p for p, _ in ALLOWED if not re.search(p, text)]
    assert unused == []
