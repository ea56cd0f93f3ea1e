"""The API reference as a reader sees it: one class rendered with the site's
own mkdocs.yml (its mkdocstrings options, its stylesheet) into HTML.

A class's heading carries its constructor's signature, with each argument's
default, and its Parameters table has a Default column, which the site's
stylesheet gives a share of the page's width.
"""

from __future__ import annotations

import html
import inspect
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import tf_crossdevice

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLASS = "tf_crossdevice.CollectiveAllReduce"
CSS = "stylesheets/extra.css"


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    """The text of the built page of CLASS, tags removed, spaces joined;
    and its HTML (page.html)."""
    folder = tmp_path_factory.mktemp("site")
    docs = folder / "docs"
    (docs / "stylesheets").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / CSS, docs / CSS)
    (docs / "page.md").write_text(f"# Page\n\n::: {CLASS}\n")
    with open(ROOT / "mkdocs.yml") as f:
        config = yaml.safe_load(f)
    # The site's options as they are; only where the pages come from and
    # go to, and paths the checkout's config gives relative to itself.
    config.update(
        docs_dir=str(docs),
        site_dir=str(folder / "site"),
        nav=[{"Page": "page.md"}],
        hooks=[],
        exclude_docs="",
    )
    (mkdocstrings,) = [
        p["mkdocstrings"] for p in config["plugins"] if "mkdocstrings" in p
    ]
    python = mkdocstrings["handlers"]["python"]
    python["paths"] = [str(ROOT)]
    python["options"]["extensions"] = [
        str(ROOT / e) for e in python["options"]["extensions"]
    ]
    (folder / "mkdocs.yml").write_text(yaml.safe_dump(config))
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "-f", str(folder / "mkdocs.yml")],
        check=True,
        cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    return (folder / "site" / "page" / "index.html").read_text()


def text(fragment: str) -> str:
    """What a reader reads of an HTML fragment."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment)))


def test_the_class_heading_shows_the_constructors_signature(page):
    heading = re.search(
        rf'<h2 id="{re.escape(CLASS)}"[^>]*>(.*?)</h2>', page, re.DOTALL
    )
    assert heading, "no heading of the class"
    assert text(heading[1]).strip().startswith(CLASS)
    # Under it, the signature as code, with every argument and its default.
    signature = re.search(
        r'class="doc-signature[^"]*"[^>]*>(.*?)</code>', page, re.DOTALL
    )
    assert signature, "no signature under the heading"
    shown = text(signature[1]).replace(" ", "")
    assert shown.startswith("CollectiveAllReduce(")
    cls = tf_crossdevice.CollectiveAllReduce
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self":
            continue
        # name, its annotation, and its default as Python writes it.
        default = "" if p.default is p.empty else re.escape(f"={p.default!r}")
        assert re.search(rf"[(,]{name}:[^=,]+{default}[,)]", shown), (
            name,
            shown,
        )


def test_the_parameters_table_has_a_default_for_each_argument(page):
    table = re.search(r"Parameters:.*?<table>(.*?)</table>", page, re.DOTALL)
    assert table, "no Parameters table"
    heads = [text(h).strip() for h in re.findall(r"<th>(.*?)</th>", table[1])]
    assert heads == ["Name", "Type", "Description", "Default"]
    rows = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table[1], re.DOTALL)[1:]:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)
        rows[text(cells[0]).strip()] = text(cells[3]).strip()
    cls = tf_crossdevice.CollectiveAllReduce
    defaults = {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self"
    }
    assert set(rows) == set(defaults)
    for name, default in defaults.items():
        assert rows[name] == repr(default), (name, rows[name])


def test_the_stylesheet_that_sizes_the_default_column_is_linked(page):
    assert f'href="../{CSS}"' in page
    css = (ROOT / "docs" / CSS).read_text()
    # The fourth and last header cell of a four-column table: Default.
    rule = re.search(r"th:nth-child\(4\):last-child\s*\{([^}]*)\}", css)
    assert rule and re.search(r"width:\s*\d+%", rule[1]), css
