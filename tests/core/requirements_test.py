"""TensorFlow as the user has it: never a second wheel, a clear error."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from tf_crossdevice._core import requirements

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
        timeout=120,
    )


def _installed_tensorflow_wheels() -> list[str]:
    """The TensorFlow distributions installed, e.g. ['tensorflow-cpu'].

    More than one means two TensorFlow wheels share one `tensorflow` module
    and the last one installed wins.
    """
    names = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in (
            "tensorflow",
            "tensorflow-cpu",
            "tensorflow-gpu",
            "tf-nightly",
            "tf-nightly-cpu",
            "intel-tensorflow",
        ):
            names.add(name)
    return sorted(names)


def test_without_tensorflow_the_error_says_what_to_install():
    # None in sys.modules makes `import tensorflow` fail as if absent.
    done = _run_python(
        "import sys; sys.modules['tensorflow'] = None; import tf_crossdevice"
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tf_crossdevice needs TensorFlow"), last
    assert "pip install 'tensorflow-cpu==2.21.*'" in last, last
    assert "pip install -e '.[cpu]'" in last, last


def test_another_tensorflow_version_is_named(tmp_path):
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2.16.1"\n')
    done = _run_python("import tf_crossdevice", PYTHONPATH=str(tmp_path))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "needs TensorFlow 2.21, found 2.16.1" in last, last
    assert "-e '.[gpu]'" in last, last


@pytest.mark.parametrize("version", ["2.21.0", "2.21.1rc0", "2.21.0-dev"])
def test_every_2_21_release_is_accepted(version):
    requirements.check_tensorflow_version(version)


@pytest.mark.parametrize("version", ["2.20.0", "2.2.1", "3.21.0", "2.210.0"])
def test_other_versions_are_refused(version):
    with pytest.raises(ImportError, match=f"found {version};"):
        requirements.check_tensorflow_version(version)


def test_this_environment_has_exactly_one_tensorflow_wheel():
    # README's commands install the package with the [cpu] extra.
    assert _installed_tensorflow_wheels() == ["tensorflow-cpu"]


def test_installing_beside_tensorflow_cpu_adds_no_tensorflow(tmp_path):
    """pip resolves the package against this venv (tensorflow-cpu 2.21) with
    no index: were `tensorflow` a requirement, resolution would fail or list
    it to install."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("tf_crossdevice", "compat"):
        shutil.copytree(
            ROOT / package,
            source / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    report = tmp_path / "report.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--quiet",
            "--report",
            str(report),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
        timeout=300,
    )
    installs = [
        item["metadata"]["name"].lower()
        for item in json.loads(report.read_text())["install"]
    ]
    assert installs == ["tf-crossdevice"], installs
