#!/usr/bin/env bash
# Installs tf_crossdevice into a fresh .venv (from nothing but python3) and
# runs the main job: data-parallel training across 2 local worker processes
# (examples/multi_worker_train.py). Extra arguments go to the job.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
.venv/bin/python examples/multi_worker_train.py "$@"
