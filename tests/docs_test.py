"""The Markdown pages (README and docs/) close every code block they open.

A fence line with text after it inside a code block (```` ``` More
text````) does not close the block: Markdown renders the rest of the page,
up to the next fence, as code, and the strict site build still passes.
"""

from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
OPENING = re.compile(r"(`{3,}|~{3,})\s*([\w+-]*)\s*$")


def fence_problems(text: str) -> list[str]:
    """Lines that break the page's code blocks, as 'line N: why'.

    >>> fence_problems("```sh\\nls\\n```\\n")
    []
    >>> fence_problems("```sh\\nls\\n``` Then run it.\\n")  # doctest: +ELLIPSIS
    ['line 3: a fence with text after it does not close the block ...']
    >>> fence_problems("```python\\nx = 1\\n")
    ['line 1: the code block opened here is never closed']
    """
    problems = []
    opened = None  # (line number, fence) of the open block
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if opened is None:
            match = OPENING.match(stripped)
            if match:
                opened = (number, match[1])
            continue
        fence = opened[1]
        if stripped.startswith(fence):
            if stripped.rstrip(fence[0]) == "":
                opened = None
            else:
                problems.append(
                    f"line {number}: a fence with text after it does not "
                    f"close the block opened on line {opened[0]}"
                )
    if opened is not None:
        problems.append(
            f"line {opened[0]}: the code block opened here is never closed"
        )
    return problems


@pytest.mark.parametrize(
    "page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES]
)
def test_every_code_block_is_closed(page):
    assert fence_problems(page.read_text()) == []


def test_the_pages_are_found():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {
        "README.md",
        "docs/index.md",
        "docs/guides/between-hosts.md",
    } <= names
