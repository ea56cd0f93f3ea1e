"""The scripts' `.venv` reuse (ensure_venv in scripts/run_example.sh): a
rerun with nothing changed runs neither venv nor pip; new extras, a changed
setup.py or pyproject.toml, a moved `.venv` and a missing one are each seen.

Each case runs the script's own functions in a folder that the script takes
for a checkout: copies of setup.py and pyproject.toml, the package, and a
`.venv` made here without pip that sees this test's environment (a .pth
file), so no case installs anything.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "run_example.sh"
STAMP = "tf_crossdevice-install.txt"


@pytest.fixture
def checkout(tmp_path):
    """A folder with setup.py, pyproject.toml, tf_crossdevice and a
    working `.venv` (its python sees this environment's packages)."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    for name in ("setup.py", "pyproject.toml"):
        shutil.copy(ROOT / name, folder / name)
    (folder / "tf_crossdevice").symlink_to(ROOT / "tf_crossdevice")
    venv = folder / ".venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
    )
    site = pathlib.Path(sysconfig.get_path("purelib", vars={"base": str(venv)}))
    # addsitedir also reads that folder's .pth files: the editable install.
    (site / "outer.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n"
    )
    # As pip's own launcher names its venv's python.
    (venv / "bin" / "pip").write_text(f"#!{venv}/bin/python\n")
    return folder


def bash(folder, command: str, python3: str | None = None):
    """`command` after sourcing the script, in `folder`; `python3`, where
    given, replaces python3 on PATH (a script that fails and says so)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if python3 is not None:
        shims = folder.parent / "shims"
        shims.mkdir(exist_ok=True)
        (shims / "python3").write_text(f"#!/bin/sh\n{python3}\n")
        (shims / "python3").chmod(0o755)
        env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["bash", "-c", f"source {SCRIPT} && {command}"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def state(folder, extras: str) -> str:
    result = bash(folder, f"_venv_state check {extras}")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def stamp(folder, extras: str) -> None:
    result = bash(folder, f"_venv_state stamp {extras}")
    assert result.returncode == 0, result.stderr


def test_a_stamped_venv_is_reused_without_venv_or_pip(checkout):
    stamp(checkout, "cpu")
    stamped = checkout / ".venv" / STAMP
    before = stamped.stat().st_mtime_ns
    result = bash(
        checkout,
        "ensure_venv cpu && echo reused",
        python3="echo python3 ran; exit 1",
    )
    assert result.returncode == 0, result.stderr
    # No "== making" or "== installing" line: pip, which would print one
    # and stamp again, never ran.
    assert result.stdout == "reused\n"
    assert stamped.stat().st_mtime_ns == before


def test_new_extras_are_installed_beside_the_stamped_ones(checkout):
    stamp(checkout, "cpu")
    assert state(checkout, "cpu") == "ok"
    assert state(checkout, "test,cpu") == "install cpu,test"
    assert state(checkout, "tensorboard") == "install cpu,tensorboard"


def test_a_changed_pyproject_or_setup_installs_again(checkout):
    stamp(checkout, "cpu")
    with open(checkout / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    assert state(checkout, "cpu") == "install cpu"
    stamp(checkout, "cpu")
    assert state(checkout, "cpu") == "ok"
    with open(checkout / "setup.py", "a") as f:
        f.write("\n# changed\n")
    assert state(checkout, "cpu") == "install cpu"


def test_an_unstamped_venv_installs(checkout):
    assert state(checkout, "cpu") == "install cpu"


def test_a_venv_moved_from_elsewhere_is_made_anew(checkout):
    stamp(checkout, "cpu")
    (checkout / ".venv" / "bin" / "pip").write_text(
        "#!/somewhere/else/.venv/bin/python\n"
    )
    assert state(checkout, "cpu") == "recreate"


def test_a_missing_venv_is_made(checkout):
    shutil.rmtree(checkout / ".venv")
    result = bash(checkout, "ensure_venv cpu", python3="exit 3")
    assert result.stdout.startswith("== making .venv"), result.stdout
    assert result.returncode != 0  # The stand-in python3 failed.
