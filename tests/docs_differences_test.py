"""The "differences from TensorFlow" page is tables a reader can scan: each
section one table of behaviour, TensorFlow, ours and why, every row filled
in (a dash where a column has nothing to add), and no list beside it."""

from __future__ import annotations

import pathlib
import re

import pytest

PAGE = (
    pathlib.Path(__file__).resolve().parents[1]
    / "docs"
    / "differences-from-tensorflow.md"
)
HEADER = ["behaviour", "TensorFlow", "ours", "why"]


def sections(text: str) -> dict[str, list[str]]:
    """The lines of each '## ' section, by its title."""
    found: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].strip()
            found[title] = []
        elif title is not None:
            found[title].append(line)
    return found


def cells(line: str) -> list[str]:
    """The cells of a Markdown table row.

    >>> cells("| a | `b \\\\| c` | d |")
    ['a', '`b \\\\| c`', 'd']
    """
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


SECTIONS = sections(PAGE.read_text())


def test_the_page_has_its_sections():
    assert list(SECTIONS) == [
        "Destinations and values",
        "Algorithms and packing",
        "The strategy",
        "Legacy classes",
    ]


@pytest.mark.parametrize("title", list(SECTIONS))
def test_each_section_is_one_filled_table(title):
    lines = SECTIONS[title]
    rows = [line for line in lines if line.startswith("|")]
    assert rows, f"{title}: no table"
    assert cells(rows[0]) == HEADER
    assert set("".join(cells(rows[1]))) <= set("-:"), rows[1]
    body = rows[2:]
    assert body, f"{title}: a table without rows"
    for row in body:
        row_cells = cells(row)
        assert len(row_cells) == len(HEADER), row
        assert all(row_cells), f"{title}: an empty cell in {row}"
    # One table: its rows follow each other, and no list sits beside it.
    first = lines.index(rows[0])
    assert lines[first : first + len(rows)] == rows, f"{title}: two tables"
    bullets = [line for line in lines if re.match(r"\s*([-*+]|\d+\.) ", line)]
    assert not bullets, bullets
