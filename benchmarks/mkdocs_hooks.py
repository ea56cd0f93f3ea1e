"""mkdocs hooks (mkdocs.yml `hooks:`): the benchmark's figures in the site.

- `on_files`: draws the benchmark page's plots from the suites' records
  (`benchmarks.plots`) and adds them as `benchmark/plots/*.svg`;
- `on_page_markdown`: fills every `{{ figure(...) }}` placeholder of a
  page (`benchmarks.figures`); one that cannot be filled fails the build
  with a message naming the page and the placeholder.

Both read `canonical.pick` of benchmarks/records/, once per build.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

# mkdocs loads this file by path; the study's package `benchmarks` is not
# installed (only tf_crossdevice is), so it is found from the checkout.
REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mkdocs.exceptions import PluginError  # noqa: E402
from mkdocs.structure.files import File, Files  # noqa: E402

from benchmarks import canonical, figures, plots  # noqa: E402

RECORDS_DIR = REPO / "benchmarks/records"
PLOTS_DIR = "benchmark/plots"
_picked: dict[str, canonical.Canonical] = {}


def _records() -> dict[str, canonical.Canonical]:
    if not _picked:
        _picked.update(canonical.pick(canonical.read(RECORDS_DIR)))
    return _picked


def on_config(config: Any) -> Any:
    _picked.clear()  # records may have changed since the last build (serve)
    return config


def on_files(files: Files, config: Any) -> Files:
    try:
        drawn = plots.draw(_records())
        # Records with figures of their own (accuracy against time).
        drawn.update(plots.record_plots(canonical.read(RECORDS_DIR)))
    except canonical.CanonicalError as e:
        raise PluginError(f"benchmark plots: {e}") from None
    for name, svg in drawn.items():
        files.append(File.generated(config, f"{PLOTS_DIR}/{name}", content=svg))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    try:
        return figures.fill(markdown, _records(), page.file.src_uri)
    except (figures.FigureError, canonical.CanonicalError) as e:
        raise PluginError(str(e)) from None
