"""Checks that BUILD lists every module and test file that is on disk.

The check itself is `check` in scripts/update_build.py. It runs on the source
tree found by resolving this file's symlinks, so under `bazel test` (where
this file is a symlink in the runfiles) it still sees files that BUILD does
not list. The mutation tests run the check on edited copies of BUILD and on
small fake trees, so they show that the check can fail.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _load_update_build():
    path = REPO / "scripts" / "update_build.py"
    spec = importlib.util.spec_from_file_location("update_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("update_build", module)
    spec.loader.exec_module(module)
    return module


update_build = _load_update_build()
THIS_FILE = "tests/build_consistency_test.py"


def _build_text() -> str:
    return (REPO / "BUILD").read_text(encoding="utf-8")


def _remove_py_test(text: str, name: str) -> str:
    pattern = re.compile(
        rf'py_test\(\n    name = "{name}",\n.*?\n\)\n', flags=re.DOTALL
    )
    new, count = pattern.subn("", text)
    assert count == 1, f"py_test {name!r} not found once in BUILD"
    return new


def _remove_line(text: str, line: str) -> str:
    assert text.count(line) == 1, f"{line!r} not found once in BUILD"
    return text.replace(line, "")


def test_build_lists_every_file_on_disk():
    problems = update_build.check(_build_text(), REPO)
    assert not problems, (
        "BUILD is out of date; run `python scripts/update_build.py`:\n  "
        + "\n  ".join(problems)
    )


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(
            lambda t: _remove_py_test(t, "build_consistency_test"),
            [f"not in BUILD: {THIS_FILE}", f"no py_test runs {THIS_FILE}"],
            id="test_target_removed",
        ),
        pytest.param(
            lambda t: _remove_line(t, '        "tf_crossdevice/testing.py",\n'),
            ["not in BUILD: tf_crossdevice/testing.py"],
            id="module_removed",
        ),
        pytest.param(
            lambda t: t.replace(
                '        "tf_crossdevice/testing.py",\n',
                '        "tf_crossdevice/testing.py",\n'
                '        "tf_crossdevice/gone.py",\n',
            ),
            ["in BUILD but not on disk: tf_crossdevice/gone.py"],
            id="stale_module",
        ),
        pytest.param(
            lambda t: t.replace(
                f'    args = ["{THIS_FILE}"],\n', '    args = ["tests"],\n'
            ),
            [f"no py_test runs {THIS_FILE}"],
            id="test_target_runs_other_path",
        ),
    ],
)
def test_check_fails_on_edited_build(edit, expected):
    text = _build_text()
    edited = edit(text)
    assert edited != text
    report = "\n".join(update_build.check(edited, REPO))
    for fragment in expected:
        assert fragment in report


def _fake_tree(root: pathlib.Path, files: dict[str, str]) -> None:
    for path, code in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(code, encoding="utf-8")


_BASE_TREE = {
    "conftest.py": "",
    "pytest.ini": "",
    "tf_crossdevice/__init__.py": "",
    "tf_crossdevice/py.typed": "",
    "tf_crossdevice/compat/__init__.py": "",
    "tests/bazel_pytest_main.py": "",
    "tests/ring_test.py": "def test_ring():\n    pass\n",
}


def _generated_build(root: pathlib.Path) -> str:
    return "# header\n" + update_build.render(root) + "\n"


@pytest.mark.parametrize(
    ("new_file", "expected"),
    [
        pytest.param(
            "tests/new_test.py",
            ["not in BUILD: tests/new_test.py", "no py_test runs tests/new_"],
            id="new_test_file",
        ),
        pytest.param(
            "tf_crossdevice/_new.py",
            ["not in BUILD: tf_crossdevice/_new.py"],
            id="new_module",
        ),
        pytest.param(
            "tf_crossdevice/compat/legacy.py",
            ["not in BUILD: tf_crossdevice/compat/legacy.py"],
            id="new_compat_module",
        ),
        pytest.param(
            "examples/train.py",
            ["not in BUILD: examples/train.py"],
            id="new_example",
        ),
        pytest.param(
            "tests/helpers.py",
            ["not in BUILD: tests/helpers.py"],
            id="new_test_helper",
        ),
    ],
)
def test_check_fails_on_file_added_to_tree(tmp_path, new_file, expected):
    _fake_tree(tmp_path, _BASE_TREE)
    text = _generated_build(tmp_path)
    assert update_build.check(text, tmp_path) == []
    _fake_tree(tmp_path, {new_file: "def main():\n    pass\n"})
    report = "\n".join(update_build.check(text, tmp_path))
    for fragment in expected:
        assert fragment in report
    assert update_build.check(_generated_build(tmp_path), tmp_path) == []


def test_check_fails_on_file_deleted_from_tree(tmp_path):
    _fake_tree(tmp_path, _BASE_TREE)
    text = _generated_build(tmp_path)
    (tmp_path / "tests/ring_test.py").unlink()
    assert update_build.check(text, tmp_path) == [
        "in BUILD but not on disk: tests/ring_test.py"
    ]


def test_check_fails_on_hand_edited_attribute(tmp_path):
    _fake_tree(tmp_path, _BASE_TREE)
    text = _generated_build(tmp_path)
    edited = text.replace('size = "medium"', 'size = "small"')
    assert edited != text
    (problem,) = update_build.check(edited, tmp_path)
    assert "generated section differs" in problem


def _rule(text: str, name: str):
    (rule,) = [r for r in update_build.parse_rules(text) if r.name == name]
    return rule


@pytest.mark.parametrize(
    ("path", "code", "tags", "size"),
    [
        pytest.param(
            "tests/ring_test.py", "", [], "medium", id="plain_test_is_medium"
        ),
        pytest.param(
            "tests/multi_worker_test.py",
            "",
            ["exclusive", "multiprocess", "requires-network"],
            "large",
            id="multi_worker_name",
        ),
        pytest.param(
            "tests/cluster_test.py",
            "",
            ["exclusive", "multiprocess", "requires-network"],
            "large",
            id="cluster_name",
        ),
        pytest.param(
            "tests/launch_test.py",
            "import subprocess\n",
            ["exclusive", "multiprocess", "requires-network"],
            "large",
            id="subprocess_in_code",
        ),
        pytest.param(
            "tests/launch_test.py",
            "from tf_crossdevice import cluster\n",
            ["exclusive", "multiprocess", "requires-network"],
            "large",
            id="cluster_module_imported",
        ),
        pytest.param(
            "tests/server_test.py",
            "import tensorflow as tf\n\ntf.distribute.Server\n",
            ["exclusive", "multiprocess", "requires-network"],
            "large",
            id="tf_server_used",
        ),
        pytest.param(
            "tests/doc_test.py",
            '"""Not: import subprocess; pytest.mark.slow."""\n',
            [],
            "medium",
            id="names_in_strings_ignored",
        ),
        pytest.param(
            "tests/fit_test.py",
            "import pytest\n\npytestmark = pytest.mark.slow\n",
            ["slow"],
            "large",
            id="slow_module_mark",
        ),
        pytest.param(
            "tests/keras_test.py",
            "import pytest\n\n\n@pytest.mark.slow\ndef test_fit():\n    pass\n",
            ["slow"],
            "large",
            id="slow_mark",
        ),
    ],
)
def test_render_tags_and_sizes(tmp_path, path, code, tags, size):
    _fake_tree(tmp_path, {**_BASE_TREE, path: code})
    rule = _rule(update_build.render(tmp_path), pathlib.Path(path).stem)
    assert rule.kind == "py_test"
    assert rule.strings("tags") == tags
    assert rule.attrs["size"] == size
    assert rule.strings("args") == [path]
    assert rule.attrs["main"] == "tests/bazel_pytest_main.py"


@pytest.mark.parametrize(
    ("files", "binary", "main"),
    [
        pytest.param(
            {"examples/train.py": "def main():\n    pass\n"},
            "example_train",
            "examples/train.py",
            id="example_with_main",
        ),
        pytest.param(
            {"tf_crossdevice/benchmark.py": "def main():\n    pass\n"},
            "benchmark",
            "tf_crossdevice/benchmark.py",
            id="benchmark_module",
        ),
        pytest.param(
            {
                "tf_crossdevice/benchmark/__init__.py": "",
                "tf_crossdevice/benchmark/__main__.py": "",
            },
            "benchmark",
            "tf_crossdevice/benchmark/__main__.py",
            id="benchmark_package",
        ),
    ],
)
def test_render_binaries(tmp_path, files, binary, main):
    _fake_tree(tmp_path, {**_BASE_TREE, **files})
    rule = _rule(update_build.render(tmp_path), binary)
    assert rule.kind == "py_binary"
    assert rule.attrs["main"] == main


def test_render_skips_example_helper_without_main(tmp_path):
    _fake_tree(
        tmp_path, {**_BASE_TREE, "examples/_common.py": "def helper(): ..."}
    )
    text = update_build.render(tmp_path)
    assert "examples/_common.py" in _rule(text, "examples").strings("srcs")
    assert not [
        r
        for r in update_build.parse_rules(text)
        if r.name.startswith("example_")
    ]


@pytest.mark.parametrize(
    ("name", "expected_srcs"),
    [
        pytest.param("a_test", ["tests/a_test.py"], id="imports_nothing"),
        pytest.param(
            "b_test", ["tests/b_test.py", "tests/a_test.py"], id="absolute"
        ),
        pytest.param(
            "c_test",
            ["tests/c_test.py", "tests/a_test.py", "tests/b_test.py"],
            id="relative_and_transitive",
        ),
        pytest.param(
            "d_test", ["tests/d_test.py", "tests/a_test.py"], id="from_package"
        ),
    ],
)
def test_render_adds_imported_test_files(tmp_path, name, expected_srcs):
    _fake_tree(
        tmp_path,
        {
            **_BASE_TREE,
            "tests/a_test.py": "import os\n",
            "tests/b_test.py": "from tests.a_test import os\n",
            "tests/c_test.py": "from .b_test import os\n",
            "tests/d_test.py": "from tests import a_test\n",
        },
    )
    rule = _rule(update_build.render(tmp_path), name)
    assert rule.strings("srcs") == [
        "tests/bazel_pytest_main.py",
        *expected_srcs,
    ]
    assert update_build.check(update_build.render(tmp_path), tmp_path) == []


def test_render_rejects_duplicate_test_names(tmp_path):
    _fake_tree(
        tmp_path,
        {**_BASE_TREE, "tf_crossdevice/ring_test.py": ""},
    )
    with pytest.raises(ValueError, match="both be Bazel target //:ring_test"):
        update_build.render(tmp_path)


def test_parse_rules_rejects_glob():
    with pytest.raises(ValueError, match="attribute 'srcs' of py_library"):
        update_build.parse_rules('py_library(name = "x", srcs = glob(["*"]))')
