"""The import contracts (.importlinter) catch what they promise to catch.

README's test command runs `lint-imports` on the tree; here each kind of
violation is made in a copy of the tree and must break its contract.
"""

from __future__ import annotations

import ast
import configparser
import pathlib
import re
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
        "from tf_crossdevice.ops import _adapter  # noqa",
        "Private modules are used only inside their folder BROKEN",
        "examples.train_models -> tf_crossdevice.ops._adapter",
    ),
    # A folder reaching past another folder's face.
    "private across folders": (
        "tf_crossdevice/collective/_reducer.py",
        "from tf_crossdevice.ops import _in_process  # noqa",
        "Private modules are used only inside their folder BROKEN",
        "tf_crossdevice.collective._reducer -> tf_crossdevice.ops._in_process",
    ),
    # A folder importing more than its docstring allows, within its layer.
    "cluster beyond _core": (
        "tf_crossdevice/cluster/_notices.py",
        "from tf_crossdevice import ops  # noqa",
        "cluster imports only _core BROKEN",
        "tf_crossdevice.cluster._notices -> tf_crossdevice.ops",
    ),
    # The package importing one of its clients.
    "client": (
        "tf_crossdevice/tuning/_cache.py",
        "import benchmarks  # noqa",
        "The package never imports its clients BROKEN",
        "tf_crossdevice.tuning._cache -> benchmarks",
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


FOLDERS = [
    "_core",
    "compression",
    "packing",
    "algorithms",
    "ops",
    "collective",
    "cluster",
    "training",
    "tuning",
]


def _contracts() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config


def _lines(config: configparser.ConfigParser, section: str, key: str):
    return [
        line.strip()
        for line in config[section][key].splitlines()
        if line.strip()
    ]


def _allowed_by_contracts(folder: str) -> set[str]:
    """The folders `folder` may import: those of the layers below its own,
    less what a forbidden contract with it as the source forbids."""
    config = _contracts()
    layers = [
        {name.strip() for name in line.split("|")}
        for line in _lines(config, "importlinter:contract:layers", "layers")
    ]
    own = next(i for i, layer in enumerate(layers) if folder in layer)
    allowed = set().union(*layers[own + 1 :])
    for section in config.sections():
        contract = config[section]
        if contract.get("type") != "forbidden":
            continue
        sources = _lines(config, section, "source_modules")
        if f"tf_crossdevice.{folder}" in sources:
            allowed -= {
                name.removeprefix("tf_crossdevice.")
                for name in _lines(config, section, "forbidden_modules")
            }
    return allowed


def _allowed_by_contributing_page(folder: str) -> set[str]:
    """The "may import" column of docs/contributing.md's table of folders
    (the package's docstrings are for users; the layering is written down
    for contributors there)."""
    page = (ROOT / "docs" / "contributing.md").read_text()
    row = re.search(rf"^\| `{folder}` \|.*\| (.*?) \|$", page, re.M)
    assert row, f"docs/contributing.md: no row for the folder {folder}"
    if row.group(1).startswith("nothing of the package outside itself"):
        return set()
    return set(re.findall(r"`(\w+)`", row.group(1)))


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_contributing_page_says_what_the_contracts_allow(folder):
    assert _allowed_by_contributing_page(folder) == _allowed_by_contracts(
        folder
    )


def test_the_contracts_allow_what_the_folders_import():
    """Sanity check of the parser above against a hand-worked case."""
    assert _allowed_by_contracts("ops") == {
        "_core",
        "compression",
        "packing",
        "algorithms",
    }
    assert _allowed_by_contracts("cluster") == {"_core"}
    assert _allowed_by_contracts("_core") == set()


# ---- Sizes and deferred imports ------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_CODE_LINES = 80


def _sources(*roots: str) -> list[pathlib.Path]:
    return sorted(p for root in roots for p in (ROOT / root).rglob("*.py"))


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _code_lines(node: ast.AST, lines: list[str]) -> int:
    """Lines of code in a function: no docstring, blank or comment line."""
    body = node.body
    start = body[0].lineno
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        start = first.end_lineno + 1
    return sum(
        1
        for line in lines[start - 1 : node.end_lineno]
        if line.strip() and not line.strip().startswith("#")
    )


def test_no_module_of_the_package_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources("tf_crossdevice", "compat")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_80_lines_of_code():
    long = {}
    for p in _sources("tf_crossdevice", "compat"):
        lines = p.read_text().splitlines()
        for node in _functions(ast.parse("\n".join(lines))):
            if (n := _code_lines(node, lines)) > MAX_FUNCTION_CODE_LINES:
                long[f"{p.relative_to(ROOT)}:{node.name}"] = n
    assert long == {}


def test_every_import_inside_a_function_says_why():
    """An import is deferred only for an optional dependency, start-up
    time or the like, and a comment on it (or just above) says which."""
    silent = []
    for p in _sources("tf_crossdevice", "compat", "benchmarks"):
        lines = p.read_text().splitlines()
        for function in _functions(ast.parse("\n".join(lines))):
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                near = lines[max(0, node.lineno - 5) : node.lineno]
                if not any("#" in line for line in near):
                    silent.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert silent == []
