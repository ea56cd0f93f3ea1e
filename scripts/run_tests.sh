#!/usr/bin/env bash
# Installs tf_crossdevice and its test tools into .venv (from nothing but
# python3; a rerun reuses a .venv that has them, see ensure_venv in
# scripts/run_example.sh) and runs every check: format, lint, types, the import
# contracts (.importlinter), the documentation site's strict build, the Bazel
# build of every target with its wiring tests (scripts/bazel_test.sh; it fails
# if Bazel can be installed here but the install or the build fails, and
# skips only where it cannot be installed), installs etcd for the
# multi-machine launcher's tests (scripts/etcd.sh: Debian's etcd-server, its
# service neither started nor enabled), then the whole pytest suite with
# doctests. pytest runs last so that its summary is the closing line.
# The venv gets tensorflow-cpu (the [cpu] extra): the package itself never
# installs a TensorFlow wheel over the one a user has.
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2

source scripts/run_example.sh  # defines ensure_venv, runs nothing
ensure_venv cpu,test,dev,docs
# pip byte-compiles what it installs, but not this checkout (installed
# editable). Compiled once here, the suite's processes (hundreds: workers,
# clients, jobs) read the bytecode instead of each compiling the package
# again where PYTHONDONTWRITEBYTECODE is set.
.venv/bin/python -m compileall -q -j 0 tf_crossdevice tests examples benchmarks

echo "== ruff format --check"
.venv/bin/ruff format --check .
echo "== ruff check"
.venv/bin/ruff check .
echo "== mypy (public API typed; config in mypy.ini)"
.venv/bin/mypy
echo "== lint-imports (the layering and public-name contracts)"
.venv/bin/lint-imports --no-cache
echo "== mkdocs build --strict (the documentation site, into a temporary folder)"
SITE_DIR=$(mktemp -d)
trap 'rm -rf "$SITE_DIR"' EXIT
.venv/bin/mkdocs build --strict --quiet --site-dir "$SITE_DIR"
echo "== bazel test //... (offline; .bazelrc: builds every target, runs the" \
  "wiring tests)"
PYTHON="$PWD/.venv/bin/python" bash scripts/bazel_test.sh
echo "== etcd (the multi-machine launcher's tests start their own)"
bash scripts/etcd.sh
echo "== pytest (every test, slow ones included, and every doctest)"
# loadgroup: conftest.py keeps tests sharing a module-scoped setup on one
# worker and schedules every other test on its own.
.venv/bin/python -m pytest -n 2 --dist loadgroup --durations=10
