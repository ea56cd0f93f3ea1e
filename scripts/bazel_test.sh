#!/usr/bin/env bash
# Runs `bazel test //...` offline with the repository's .bazelrc: it builds
# every target (each py_library, py_binary and py_test) and runs the tests
# tagged "wiring" (//:doctest and one test file per tests/ folder,
# WIRING_TESTS in BUILD); scripts/run_tests.sh runs every test with pytest.
#
#   PYTHON=/path/to/venv/bin/python bash scripts/bazel_test.sh [bazel test flags]
#
# $PYTHON (default: python3 on PATH) must have tensorflow and pytest; its
# directory goes first on PATH, and .bazelrc passes PATH to the tests, so
# Bazel's Python toolchain runs the tests with "$(dirname $PYTHON)/python3".
# Extra arguments go to `bazel test`: --config=full runs every test, the ones
# tagged slow included; --config=quick every test but the slow and
# multiprocess ones (see .bazelrc).
#
# Without bazel, the script installs Debian's bazel-bootstrap and
# bazel-bootstrap-source with apt-get, as root or with sudo without a
# password. Where that cannot possibly work (no apt-get, or neither root nor
# passwordless sudo) it prints "skipping bazel: <reason>" and exits 0. Where it
# can, a failed apt-get, or a bazel still missing after it, is an error (exit
# 1). When bazel runs, the exit code is bazel's. The Bazel server is shut down
# afterwards, and no bazel-* symlinks are left in the tree (.bazelrc).
set -euo pipefail

cd "$(dirname "$0")/.."
MOCK_REPOS=/usr/src/bazel-bootstrap/mock_repos

skip() {
  echo "skipping bazel: $* (Bazel cannot be installed on this machine;" \
    "the Bazel build and its tests did NOT run)"
  exit 0
}

fail() {
  echo "bazel_test.sh: $*" >&2
  exit 1
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  else
    sudo -n "$@"
  fi
}

install_bazel() {
  command -v apt-get >/dev/null || skip "$1, and apt-get is not available"
  if [[ $(id -u) -ne 0 ]] \
    && ! { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
    skip "$1, and this user is neither root nor allowed sudo without a" \
      "password, so apt-get cannot install it"
  fi
  echo "installing Debian's bazel-bootstrap ($1)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    || fail "$1, and \`apt-get update\` failed (offline?); install" \
      "bazel-bootstrap and bazel-bootstrap-source by hand"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    bazel-bootstrap bazel-bootstrap-source >/dev/null \
    || fail "$1, and \`apt-get install bazel-bootstrap" \
      "bazel-bootstrap-source\` failed"
}

if ! command -v bazel >/dev/null; then
  install_bazel "bazel is not installed"
  command -v bazel >/dev/null \
    || fail "bazel-bootstrap is installed but there is no bazel on PATH"
fi
if [[ ! -d $MOCK_REPOS ]]; then
  install_bazel "$MOCK_REPOS (bazel-bootstrap-source) is missing"
  [[ -d $MOCK_REPOS ]] \
    || fail "bazel-bootstrap-source is installed but $MOCK_REPOS is missing"
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
