"""BUILD's test lists say what they claim.

SLOW_TESTS lists exactly the test files marked slow: `--config=quick` leaves
out the tests tagged slow (.bazelrc), and BUILD tags the ones SLOW_TESTS
names. A slow file missing there would make that run long; a listed file that
lost its mark would no longer be left out.

WIRING_TESTS, the only test files that the default `bazel test //...` runs
(tagged "wiring"), names one existing, quick (not slow) test file in each
folder under tests/, so that this run shows every folder's BUILD wiring. A
new folder without an entry, an entry whose file was moved or renamed, or a
second entry for one folder fails here.
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


def wiring_problems(entries: list[str], test_files: list[str]) -> list[str]:
    """What is wrong with WIRING_TESTS `entries`, given the test files.

    `test_files` are paths under tests/ without ".py" ("core/checks_test");
    an entry must be one of them, in a sub-folder, not slow, and every
    sub-folder holding test files needs exactly one entry.

    >>> wiring_problems(["a/x_test"], ["a/x_test", "a/y_test", "z_test"])
    []
    >>> wiring_problems(["z_test"], ["a/x_test", "z_test"])
    ['z_test is not in a sub-folder of tests/', 'no entry for tests/a/']
    """
    problems = [
        f"no tests/{entry}.py" for entry in entries if entry not in test_files
    ]
    folders: dict[str, list[str]] = {}
    for entry in entries:
        folder, _, name = entry.rpartition("/")
        if not folder:
            problems.append(f"{entry} is not in a sub-folder of tests/")
            continue
        folders.setdefault(folder, []).append(name)
    for folder, names in sorted(folders.items()):
        if len(names) > 1:
            problems.append(f"tests/{folder}/ has several entries: {names}")
    needed = sorted({f.rpartition("/")[0] for f in test_files} - {""})
    problems += [f"no entry for tests/{f}/" for f in needed if f not in folders]
    return problems


def _test_files() -> list[str]:
    tests = REPO / "tests"
    return sorted(
        path.relative_to(tests).with_suffix("").as_posix()
        for path in tests.rglob("*_test.py")
    )


def test_one_wiring_test_per_tests_folder():
    files = _test_files()
    assert any("/" in f for f in files), "no test files in tests/ sub-folders"
    problems = wiring_problems(_build_list("WIRING_TESTS"), files)
    assert not problems, "BUILD's WIRING_TESTS: " + "; ".join(problems)


def test_wiring_tests_are_not_slow():
    # The default Bazel run is the quick one; slow tests run under pytest.
    slow = set(_build_list("SLOW_TESTS")) | set(_build_list("LONG_TESTS"))
    wiring = {entry.rpartition("/")[2] for entry in _build_list("WIRING_TESTS")}
    assert not wiring & slow, f"slow or long in WIRING_TESTS: {wiring & slow}"


def test_wiring_problems_can_fail():
    files = _test_files()
    entries = _build_list("WIRING_TESTS")
    folder = entries[0].rpartition("/")[0]
    # A folder left out.
    assert wiring_problems(entries[1:], files) == [
        f"no entry for tests/{folder}/"
    ]
    # A second entry for a folder, naming a file that does not exist.
    gone = f"{folder}/gone_test"
    assert wiring_problems([*entries, gone], files) == [
        f"no tests/{gone}.py",
        f"tests/{folder}/ has several entries: "
        f"{[entries[0].rpartition('/')[2], 'gone_test']}",
    ]
