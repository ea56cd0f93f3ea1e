#!/usr/bin/env bash
# Installs tf_crossdevice into .venv (from nothing but python3) and runs the
# main job (examples/train.py with no flags): 2 local worker processes x 2
# logical CPUs train a small ResNet-style CNN between-graph with
# HierarchicalCollectiveAllReduce, print progress and a summary (examples/s,
# loss, accuracy), and stop. Extra arguments go to the job, e.g.
# --mode=in_graph or --mode=mirrored (examples/train.py --helpshort).
# .venv gets the [cpu] extra (tensorflow-cpu) and the [tensorboard] one, for
# the `tensorboard --logdir=...` the job prints (run it as
# .venv/bin/tensorboard, or after `source .venv/bin/activate`).
#
# A rerun reuses .venv without running pip (ensure_venv below); a missing or
# broken one is made anew. scripts/run_tests.sh sources this file for
# ensure_venv only.

# ensure_venv EXTRAS: makes ./.venv hold this checkout installed editable
# with EXTRAS (comma-separated, e.g. cpu,tensorboard). A .venv that already
# has them, installed from this setup.py and pyproject.toml (a stamp holds
# their hash) and whose packages are all present, is used as it is. Else pip
# installs what is missing (and the extras installed before, so that one
# .venv serves both scripts); a .venv that has no working python or was
# moved from elsewhere (its scripts name the old path) is made anew.
ensure_venv() {
  local needed=$1 state
  state=$(_venv_state check "$needed" 2>/dev/null) || state=recreate
  case $state in
    ok) return 0 ;;
    recreate)
      echo "== making .venv and installing tf_crossdevice[$needed] (a few" \
        "minutes; later runs reuse it)"
      python3 -m venv --clear .venv
      .venv/bin/python -m pip install -q --upgrade pip
      ;;
    install\ *)
      needed=${state#install }
      echo "== installing tf_crossdevice[$needed] into .venv"
      ;;
    *)
      echo "ensure_venv: unexpected state '$state'" >&2
      return 1
      ;;
  esac
  # The filter silences setuptools' "Editable installation" notice (pip
  # shows a build backend's warnings when it builds a local folder).
  PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install -q -e ".[$needed]"
  _venv_state stamp "$needed"
}

# _venv_state check EXTRAS: prints ok, `install EXTRAS` or recreate.
# _venv_state stamp EXTRAS: records a finished install.
# Run by .venv's python from the checkout, isolated (-I: neither the checkout
# nor PYTHON* variables on its path, so it sees only what is installed).
_venv_state() {
  .venv/bin/python -I - "$@" <<'EOF'
import hashlib
import importlib.metadata as md
import importlib.util
import os
import re
import sys

mode, needed = sys.argv[1], set(sys.argv[2].split(","))
venv = sys.prefix
stamp = os.path.join(venv, "tf_crossdevice-install.txt")
sources = b"".join(open(n, "rb").read() for n in ("setup.py", "pyproject.toml"))
digest = hashlib.sha256(sources).hexdigest()


def same(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def missing(extras):
    """What tf_crossdevice[extras], installed from this checkout, lacks."""
    spec = importlib.util.find_spec("tf_crossdevice")
    if spec is None or not same(spec.origin, "tf_crossdevice/__init__.py"):
        return ["tf_crossdevice installed from this checkout"]
    lacking = []
    for requirement in md.requires("tf_crossdevice") or []:
        extra = re.search(r'extra == "(.+?)"', requirement)
        if extra is None or extra[1] in extras:
            name = re.match(r"[\w.-]+", requirement)[0]
            try:
                md.distribution(name)
            except md.PackageNotFoundError:
                lacking.append(name)
    return lacking


if mode == "stamp":
    if missing(needed):
        sys.exit(f"after installing, .venv still lacks {missing(needed)}")
    with open(stamp, "w") as f:
        f.write(f"{digest} {','.join(sorted(needed))}\n")
    sys.exit()
try:
    with open(stamp) as f:
        stamped, extras = f.read().split()
    have = set(extras.split(","))
except (OSError, ValueError):
    stamped, have = "", set()
# A .venv moved or copied from elsewhere keeps scripts that name the old path.
with open(os.path.join(venv, "bin", "pip")) as f:
    pip_python = f.readline()[2:].strip()
if (
    not same(venv, ".venv")
    or not same(os.path.dirname(pip_python), os.path.join(venv, "bin"))
    or importlib.util.find_spec("pip") is None
):
    print("recreate")
elif stamped == digest and needed <= have and not missing(needed):
    print("ok")
else:
    print("install", ",".join(sorted(needed | have)))
EOF
}

# Sourced (by scripts/run_tests.sh): define ensure_venv and stop here.
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  return 0
fi

set -euo pipefail
cd "$(dirname "$0")/.."

ensure_venv cpu,tensorboard
exec .venv/bin/python examples/train.py "$@"
