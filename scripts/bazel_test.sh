#!/usr/bin/env bash
# Runs `bazel test //...` offline with the repository's .bazelrc.
#
#   PYTHON=/path/to/venv/bin/python bash scripts/bazel_test.sh [bazel test flags]
#
# $PYTHON (default: python3 on PATH) must have tensorflow and pytest; its
# directory goes first on PATH, and .bazelrc passes PATH to the tests, so
# Bazel's Python toolchain runs the tests with "$(dirname $PYTHON)/python3".
# Extra arguments go to `bazel test`: --config=full also runs the tests tagged
# slow (left out by default, see .bazelrc), --config=quick leaves out
# multiprocess tests too.
#
# Without bazel, the script installs Debian's bazel-bootstrap and
# bazel-bootstrap-source with apt-get when it can (root, or sudo without a
# password); otherwise it prints "skipping bazel: <reason>" and exits 0.
# When bazel runs, the exit code is bazel's. The Bazel server is shut down
# afterwards, and no bazel-* symlinks are left in the tree (.bazelrc).
set -euo pipefail

cd "$(dirname "$0")/.."
MOCK_REPOS=/usr/src/bazel-bootstrap/mock_repos

skip() {
  echo "skipping bazel: $*"
  exit 0
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo -n "$@"
  else
    return 1
  fi
}

install_bazel() {
  command -v apt-get >/dev/null || skip "$1, and apt-get is not available"
  echo "installing Debian's bazel-bootstrap ($1)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
    || skip "$1, and apt-get update failed (not root, or offline?)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    bazel-bootstrap bazel-bootstrap-source >/dev/null \
    || skip "$1, and apt-get install bazel-bootstrap failed"
}

if ! command -v bazel >/dev/null; then
  install_bazel "bazel is not installed"
fi
if [[ ! -d $MOCK_REPOS ]]; then
  install_bazel "$MOCK_REPOS (bazel-bootstrap-source) is missing"
fi

PYTHON_PATH=$(command -v "${PYTHON:-python3}" || true)
if [[ -z $PYTHON_PATH ]]; then
  echo "bazel_test.sh: no Python '${PYTHON:-python3}'; set PYTHON to a" \
    "venv's python" >&2
  exit 2
fi
PYTHON_BIN=$(cd "$(dirname "$PYTHON_PATH")" && pwd)
if ! "$PYTHON_BIN/python3" -c "import pytest, tensorflow" 2>/dev/null; then
  echo "bazel_test.sh: $PYTHON_BIN/python3 (what Bazel will run) cannot" \
    "import pytest and tensorflow; set PYTHON to a venv's python" >&2
  exit 2
fi
export PATH="$PYTHON_BIN:$PATH"

trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT
bazel test //... "$@"
