"""A Griffe extension: doctest examples in any docstring become code blocks.

Google style turns `>>>` lines into code only under an "Examples:" heading;
elsewhere Markdown would read them as quotes and their outputs (such as
`[4.0, 6.0]`) as links. This wraps each doctest block (from its first
`>>>` line to the next blank line) in a `pycon` fence, wherever it is.
mkdocs.yml loads it for the API pages; the package's code is unchanged.
"""

from __future__ import annotations

from typing import Any

import griffe


def fenced(text: str) -> str:
    """`text` with each doctest block fenced as `pycon` (with a blank line
    before the fence where the block follows text directly)."""
    out: list[str] = []
    in_fence = in_example = False
    indent = ""
    for line in text.split("\n"):
        stripped = line.strip()
        if in_example and not stripped:
            out.append(indent + "```")
            in_example = False
        elif not in_example and not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            if out and out[-1].strip():
                out.append("")
            out.append(indent + "```pycon")
            in_example = True
        elif not in_example and stripped.startswith("```"):
            in_fence = not in_fence
        out.append(line)
    if in_example:
        out.append(indent + "```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fences the doctest blocks of every object's docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fenced(obj.docstring.value)
