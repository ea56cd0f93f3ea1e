#!/usr/bin/env bash
# Makes sure this machine has an `etcd` binary, for the tests of the
# multi-machine launcher (tests/cluster/rendezvous_test.py starts a private
# etcd on free ports of 127.0.0.1 for each test and stops it; nothing here
# starts one). scripts/run_tests.sh runs it before pytest.
#
#   bash scripts/etcd.sh
#
# Without etcd on PATH, the script installs Debian's etcd-server with
# apt-get, as root or with sudo without a password, as scripts/bazel_test.sh
# installs Bazel. The package would start etcd as a service (its init script,
# or its systemd unit where systemd runs) and enable it at boot: the install
# runs under a policy-rc.d that forbids starting services (unless the machine
# has a policy-rc.d of its own), and afterwards the service is stopped and
# disabled, so no etcd is left running, now or after a reboot. Where that
# cannot possibly work (no apt-get, or neither root nor passwordless sudo) it
# prints "skipping etcd: <reason>" and exits 0 (the rendezvous tests then
# skip, saying why). Where it can, a failed apt-get, or an etcd still missing
# after it, is an error (exit 1).
set -euo pipefail

POLICY=/usr/sbin/policy-rc.d

skip() {
  echo "skipping etcd: $* (etcd cannot be installed on this machine; the" \
    "multi-machine launcher's tests will skip)"
  exit 0
}

fail() {
  echo "etcd.sh: $*" >&2
  exit 1
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  else
    sudo -n "$@"
  fi
}

# Stops the etcd service the package may have started, and keeps it from
# starting at boot: under systemd, its unit; else its init script's links.
disable_service() {
  if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
    as_root systemctl disable --now etcd.service >/dev/null 2>&1 || true
  elif [[ -x /etc/init.d/etcd ]]; then
    as_root /etc/init.d/etcd stop >/dev/null 2>&1 || true
    as_root update-rc.d etcd disable >/dev/null 2>&1 || true
  fi
}

command -v etcd >/dev/null && exit 0

command -v apt-get >/dev/null \
  || skip "etcd is not installed, and apt-get is not available"
if [[ $(id -u) -ne 0 ]] \
  && ! { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; then
  skip "etcd is not installed, and this user is neither root nor allowed" \
    "sudo without a password, so apt-get cannot install it"
fi

echo "installing Debian's etcd-server (etcd is not installed; its service" \
  "is neither started nor enabled)"
if [[ ! -e $POLICY ]]; then
  # invoke-rc.d and deb-systemd-invoke ask this before starting a service;
  # 101 means "not allowed".
  printf '#!/bin/sh\nexit 101\n' | as_root tee "$POLICY" >/dev/null
  as_root chmod 755 "$POLICY"
  trap 'as_root rm -f "$POLICY"' EXIT
fi
as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
  || fail "etcd is not installed, and \`apt-get update\` failed (offline?);" \
    "install etcd-server by hand"
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
  etcd-server >/dev/null \
  || fail "etcd is not installed, and \`apt-get install etcd-server\` failed"
disable_service
command -v etcd >/dev/null \
  || fail "etcd-server is installed but there is no etcd on PATH"
echo "etcd: $(etcd --version | head -n 1)"
