#!/usr/bin/env bash
# Installs tf_crossdevice and its test tools into a fresh .venv (from nothing
# but python3) and runs every check: format, lint, types, the Bazel build
# (when Bazel is, or can be, installed), then the whole pytest suite with
# doctests. pytest runs last so that its summary is the closing line.
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,dev]'

echo "== ruff format --check"
.venv/bin/ruff format --check .
echo "== ruff check"
.venv/bin/ruff check .
echo "== mypy (public API typed; config in mypy.ini)"
.venv/bin/mypy
echo "== bazel test //... (offline; .bazelrc)"
PYTHON="$PWD/.venv/bin/python" bash scripts/bazel_test.sh
echo "== pytest (every test, slow ones included, and every doctest)"
# loadgroup: conftest.py keeps tests sharing a module-scoped setup on one
# worker and schedules every other test on its own.
.venv/bin/python -m pytest -n 2 --dist loadgroup --durations=10
