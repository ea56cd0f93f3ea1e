#!/usr/bin/env bash
# Installs tf_crossdevice into a fresh .venv (from nothing but python3) and
# runs the main job (examples/train.py with no flags): 2 local worker
# processes x 2 logical CPUs train a small ResNet-style CNN between-graph
# with HierarchicalCollectiveAllReduce, print progress and a summary
# (examples/s, loss, accuracy), and stop. Extra arguments go to the job,
# e.g. --mode=in_graph or --mode=mirrored (examples/train.py --helpshort).
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[cpu]'
.venv/bin/python examples/train.py "$@"
