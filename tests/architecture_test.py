"""The import contracts (.importlinter) catch what they promise to catch.

README's test command runs `lint-imports` on the tree; here each kind of
violation is made in a copy of the tree and must break its contract.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"


def _copy_tree(target: pathlib.Path) -> None:
    for package in ("tf_crossdevice", "compat", "benchmarks", "examples"):
        shutil.copytree(
            ROOT / package,
            target / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    shutil.copy(ROOT / ".importlinter", target / ".importlinter")


def _lint(tree: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=tree,
        timeout=300,
    )


def _append(path: pathlib.Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


VIOLATIONS = {
    # A bottom folder reaching up: _core must import nothing above it.
    "upward": (
        "tf_crossdevice/_core/checks.py",
        "from tf_crossdevice.tuning import cost_model  # noqa",
        "The package's folders are layered BROKEN",
        "tf_crossdevice._core.checks -> tf_crossdevice.tuning.cost_model",
    ),
    # Folders of one layer stay independent of each other.
    "sideways": (
        "tf_crossdevice/packing/_plan.py",
        "from tf_crossdevice.compression import _codec  # noqa",
        "The package's folders are layered BROKEN",
        "tf_crossdevice.packing._plan -> tf_crossdevice.compression._codec",
    ),
    # The top folders too: training does not import tuning.
    "sideways at the top": (
        "tf_crossdevice/training/_accumulate.py",
        "from tf_crossdevice.tuning import cost_model  # noqa",
        "The package's folders are layered BROKEN",
        "tf_crossdevice.training._accumulate -> tf_crossdevice.tuning",
    ),
    # An import deferred into a function still counts, cycles included.
    "deferred cycle": (
        "tf_crossdevice/algorithms/_ring_schedule.py",
        "def _late():\n    from tf_crossdevice.algorithms import _ring  # noqa",
        "No import cycles inside a folder BROKEN",
        "._ring_schedule -> ._ring (1 import)",
    ),
    # A client of the package reaching into a private module.
    "private": (
        "examples/train_models.py",
        "from tf_crossdevice.ops import _base  # noqa",
        "compat, examples and benchmarks use public names only BROKEN",
        "examples.train_models -> tf_crossdevice.ops._base",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(VIOLATIONS))
def test_each_kind_of_violation_breaks_its_contract(tmp_path, kind):
    path, line, broken, named = VIOLATIONS[kind]
    _copy_tree(tmp_path)
    clean = _lint(tmp_path)
    assert clean.returncode == 0, clean.stdout[-3000:]
    _append(tmp_path / path, line)
    done = _lint(tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert broken in done.stdout, done.stdout[-3000:]
    assert named in done.stdout, done.stdout[-3000:]
