"""The layers import only the layers below them (STYLE.md, "Layout").

schedules and the argument checks (_checks.py): pure Python, no
TensorFlow; builders: TensorFlow, schedules, checks and other builders,
never the CrossDeviceOps classes or packing above them.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tf_crossdevice"


def imported_modules(path):
    """Every module `path` imports, as dotted names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def modules_of(layer):
    return sorted((PACKAGE / layer).glob("*.py"), key=str)


# The pure-Python bottom of the package.
PURE = ("tf_crossdevice._schedules", "tf_crossdevice._checks")


@pytest.mark.parametrize(
    "path",
    [*modules_of("_schedules"), PACKAGE / "_checks.py"],
    ids=lambda p: p.name,
)
def test_schedules_import_no_tensorflow_and_nothing_above(path):
    for name in imported_modules(path):
        assert name.split(".")[0] != "tensorflow", name
        if name == "tf_crossdevice":
            continue  # `from tf_crossdevice import X` is checked as X.
        if name.startswith("tf_crossdevice"):
            assert name.startswith(PURE), name


# What a builder may use from the package, besides other builders.
BELOW_BUILDERS = (*PURE, "tf_crossdevice._tf_internal")


@pytest.mark.parametrize("path", modules_of("_builders"), ids=lambda p: p.name)
def test_builders_import_no_ops_classes(path):
    for name in imported_modules(path):
        if name in ("tf_crossdevice", "tf_crossdevice._builders"):
            continue  # `from tf_crossdevice import X` is checked as X.
        if name.startswith("tf_crossdevice"):
            assert name.startswith(
                ("tf_crossdevice._builders", *BELOW_BUILDERS)
            ), name
