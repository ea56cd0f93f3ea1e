"""The wheel holds the library and not the benchmark study.

The legacy layer, kept in the top-level compat/ folder, installs as
tf_crossdevice.compat.

Builds the wheel from a copy of what setup.py reads (no network, no build
isolation: setuptools and wheel come with the test environment) and lists
what is inside.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_has_the_package_and_no_benchmark_study(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("tf_crossdevice", "compat", "benchmarks"):
        shutil.copytree(
            ROOT / package,
            source / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--no-cache-dir",
            "--quiet",
            "--wheel-dir",
            str(tmp_path / "dist"),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("tf_crossdevice-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("benchmarks/")], names
    # The top-level compat/ folder installs inside the package.
    assert not [n for n in names if n.startswith("compat/")], names
    # The measuring core the library needs stays; so does the type marker.
    for needed in (
        "tuning/measure.py",
        "cluster/processes.py",
        "compat/__init__.py",
    ):
        assert f"tf_crossdevice/{needed}" in names, needed
    assert "tf_crossdevice/py.typed" in names
