"""The Markdown pages (README and docs/) close every code block they open.

A fence line with text after it inside a code block (```` ``` More
text````) does not close the block: Markdown renders the rest of the page,
up to the next fence, as code, and the strict site build still passes.
"""

from __future__ import annotations

import ast
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


# ---- The API reference's list of public names ----------------------------

API_INDEX = REPO / "docs" / "api" / "index.md"
BEGIN = "<!-- public names: written by `python tests/docs_test.py` -->"
END = "<!-- end of public names -->"

# Each module an API page renders (`::: module`), in the order of the
# site's navigation, with its page and the name it is imported by.
API_PAGES = [
    ("tf_crossdevice.ops", "ops.md"),
    ("tf_crossdevice.collective", "collective.md"),
    ("tf_crossdevice.cluster", "cluster.md"),
    ("tf_crossdevice.cluster.processes", "cluster.md"),
    ("tf_crossdevice.cluster.hosts", "cluster.md"),
    ("tf_crossdevice.tuning", "tuning.md"),
    ("tf_crossdevice.tuning.cost_model", "tuning.md"),
    ("tf_crossdevice.tuning.measure", "tuning.md"),
    ("tf_crossdevice.training", "training.md"),
    ("tf_crossdevice.algorithms", "algorithms.md"),
    ("tf_crossdevice.packing", "packing.md"),
    ("tf_crossdevice.compression", "compression.md"),
    ("tf_crossdevice.testing", "testing.md"),
    ("tf_crossdevice.launch", "launch.md"),
    ("compat", "compat.md"),
    ("compat.upgrade", "compat.md"),
]


def _runtime_name(module: str) -> str:
    """The name a page's module is imported by (compat/ is installed as
    tf_crossdevice.compat; the site reads it as the top-level `compat`)."""
    return "tf_crossdevice." + module if module.startswith("compat") else module


def _summary(docstring) -> str:
    """A docstring's first paragraph on one line ('' without one); a `|`
    would end its table cell."""
    if docstring is None:
        return ""
    first = docstring.value.strip().split("\n\n")[0]
    return " ".join(first.split()).replace("|", "\\|")


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False
    return True


def _attribute_summary(member) -> str:
    """What an undocumented constant or alias is: its value, when short and
    public."""
    value = str(getattr(member, "value", "") or "")
    private = re.search(r"(^|\.)_[a-z]", value)
    call = "(" in value and not _is_literal(value)
    if value and len(value) <= 60 and not (private or call or "\n" in value):
        return f"`= {value}`".replace("|", "\\|")
    return ""


def public_names_markdown() -> str:
    """The tables of public names that docs/api/index.md holds between
    BEGIN and END: `tf_crossdevice.__all__`, then each page's module's
    `__all__`, each name linked to its documentation, with its summary
    (read from the docstrings by Griffe, as the site does)."""
    import importlib

    griffe = pytest.importorskip("griffe")
    loader = griffe.GriffeLoader(search_paths=[str(REPO)])
    roots = {name: loader.load(name) for name in ("tf_crossdevice", "compat")}
    loader.resolve_aliases(external=False, implicit=False)

    def member(path: str):
        root, _, rest = path.partition(".")
        return roots[root][rest] if rest else roots[root]

    def row(name: str, path: str) -> str:
        found = member(path)
        try:
            text = _summary(found.docstring) or _attribute_summary(found)
        except griffe.AliasResolutionError:  # an alias of TensorFlow's
            text = ""
        return f"| [`{name}`][{path}] | {text or '—'} |"

    modules = {
        page_module: importlib.import_module(_runtime_name(page_module))
        for page_module, _ in API_PAGES
    }
    top = importlib.import_module("tf_crossdevice")

    def home(name: str) -> str:
        """Where a top-level name is documented: its module's page, or
        the first page whose module exports the same object."""
        value = getattr(top, name)
        for page_module, module in modules.items():
            if getattr(value, "__name__", None) == module.__name__:
                return page_module
        for page_module, module in modules.items():
            if getattr(module, name, None) is value and name in module.__all__:
                return f"{page_module}.{name}"
        raise AssertionError(f"tf_crossdevice.{name} is on no API page")

    header = ["| name | what it is |", "| --- | --- |"]
    out = [
        "## Top level",
        "",
        "What `import tf_crossdevice` gives; each name links to the page",
        "of the folder that defines it.",
        "",
        *header,
        *(row(name, home(name)) for name in top.__all__),
    ]
    for page_module, page in API_PAGES:
        shown = page_module
        if page_module.startswith("compat"):
            shown = "tf_crossdevice." + page_module
        out += ["", f"## [{shown}]({page})", "", *header]
        out += [
            row(name, f"{page_module}.{name}")
            for name in modules[page_module].__all__
        ]
    return "\n".join(out)


def test_the_api_index_lists_every_public_name():
    """docs/api/index.md's tables are what the code exports; on a
    mismatch, `python tests/docs_test.py` rewrites them."""
    text = API_INDEX.read_text()
    assert BEGIN in text and END in text, f"{API_INDEX}: no {BEGIN}"
    written = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert written == public_names_markdown(), (
        "docs/api/index.md's public names are stale: run "
        "`python tests/docs_test.py` to rewrite them"
    )


def _write_api_index() -> None:
    text = API_INDEX.read_text()
    before, _, rest = text.partition(BEGIN)
    _, _, after = rest.partition(END)
    API_INDEX.write_text(
        f"{before}{BEGIN}\n\n{public_names_markdown()}\n\n{END}{after}"
    )


if __name__ == "__main__":
    _write_api_index()
