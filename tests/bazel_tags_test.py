"""BUILD's SLOW_TESTS lists exactly the test files marked slow.

Bazel's default run leaves out the tests tagged slow (.bazelrc), and BUILD
tags the ones its SLOW_TESTS names. A slow file missing there would make that
run long; a listed file that lost its mark would no longer run there.
"""

from __future__ import annotations

import ast
import pathlib
import re

# Under Bazel: the runfiles root, which holds BUILD and the test files.
REPO = pathlib.Path(__file__).absolute().parents[1]


def _build_list(name: str) -> list[str]:
    build = (REPO / "BUILD").read_text(encoding="utf-8")
    found = re.search(rf"^{name} = (\[.*?\])", build, re.MULTILINE | re.DOTALL)
    assert found, f"BUILD has no `{name} = [...]`"
    return ast.literal_eval(found.group(1))


def test_slow_tests_are_the_files_marked_slow():
    marked = sorted(
        path.stem
        for path in sorted((REPO / "tests").rglob("*_test.py"))
        if path.name != pathlib.Path(__file__).name
        and "pytest.mark.slow" in path.read_text(encoding="utf-8")
    )
    listed = sorted(_build_list("SLOW_TESTS"))
    assert listed == marked, f"BUILD's SLOW_TESTS should be {marked}"


def test_multiprocess_tests_are_slow():
    # pytest.ini: a slow test "starts real worker processes or trains a model".
    multiprocess = set(_build_list("MULTIPROCESS_TESTS"))
    extra = multiprocess - set(_build_list("SLOW_TESTS"))
    assert not extra, f"in MULTIPROCESS_TESTS but not SLOW_TESTS: {extra}"
