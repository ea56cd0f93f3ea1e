"""Runs pytest on the paths given as arguments, as Bazel's py_test `main`.

Every py_test in BUILD runs this file with one test file (or, for the
doctests, the package directories) as its arguments. It runs pytest from the
workspace root of the test's runfiles, so the top-level conftest.py (8
logical CPU devices) and pytest.ini apply exactly as in a plain `pytest`
run, and exits with pytest's exit code. Outside Bazel it works the same from
the repository:

    python tests/bazel_pytest_main.py tests/packing_test.py

Bazel's test environment is honoured: the JUnit XML report goes to
$XML_OUTPUT_FILE, `bazel test --test_filter=EXPR` becomes `pytest -k EXPR`,
and HOME (unset by Bazel) points at $TEST_TMPDIR so that Keras and TF write
their caches there instead of in the user's home.
"""

from __future__ import annotations

import os
import pathlib
import sys


def workspace_root() -> pathlib.Path:
    """Returns the directory holding conftest.py and pytest.ini.

    Under `bazel test` that is the main repository inside the runfiles tree
    ($TEST_SRCDIR/$TEST_WORKSPACE); otherwise the parent of tests/.
    """
    srcdir = os.environ.get("TEST_SRCDIR")
    workspace = os.environ.get("TEST_WORKSPACE")
    if srcdir and workspace:
        return pathlib.Path(srcdir, workspace)
    return pathlib.Path(__file__).absolute().parent.parent


def pytest_args(root: pathlib.Path, paths: list[str]) -> list[str]:
    """Returns pytest's command line for `paths` under `root`.

    >>> pytest_args(pathlib.Path("/ws"), ["tests/a_test.py"])[:4]
    ['--rootdir', '/ws', '-c', '/ws/pytest.ini']
    """
    args = ["--rootdir", str(root), "-c", str(root / "pytest.ini")]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args += ["--junitxml", xml]
    test_filter = os.environ.get("TESTBRIDGE_TEST_ONLY")
    if test_filter:
        args += ["-k", test_filter]
    return args + paths


def main(argv: list[str]) -> int:
    """Runs pytest on `argv[1:]` and returns its exit code."""
    if len(argv) < 2:
        print(f"usage: {argv[0]} PATH...", file=sys.stderr)
        return 2
    root = workspace_root()
    os.chdir(root)
    # Runfiles are read-only symlinks; don't try to write .pyc next to them.
    # Worker processes the tests start inherit the environment variable.
    sys.dont_write_bytecode = True
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    if "TEST_TMPDIR" in os.environ and "HOME" not in os.environ:
        os.environ["HOME"] = os.environ["TEST_TMPDIR"]
    import pytest

    return int(pytest.main(pytest_args(root, argv[1:])))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
