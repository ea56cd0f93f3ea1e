#!/usr/bin/env bash
# Installs tf_crossdevice and its test tools into a fresh .venv (from nothing
# but python3) and runs every check: format, lint, types, the test suite with
# doctests, and the Bazel build when Bazel is (or can be) installed.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,dev]'

echo "== ruff format --check"
.venv/bin/ruff format --check .
echo "== ruff check"
.venv/bin/ruff check .
echo "== mypy (public API)"
.venv/bin/mypy
echo "== pytest (tests and doctests)"
.venv/bin/python -m pytest -n 2 --durations=15
echo "== bazel"
PYTHON="$PWD/.venv/bin/python" bash scripts/bazel_test.sh
