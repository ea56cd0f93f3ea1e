#!/usr/bin/env bash
# Draws docs/guides/img/two-host-step.png: one step of the example job on two
# emulated hosts (1 Gbit/s links, a core share each), as TensorBoard's
# profile plugin shows it, opened in headless Chromium. Needs root (the
# emulated hosts are network namespaces) and python3; installs Debian's
# Chromium where it is missing, and the viewer's Python packages into
# .venv-viewer, apart from the job's .venv (TensorBoard's profile plugin
# and Playwright are no dependency of the package).
#
#   sudo bash scripts/timeline_screenshot.sh [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/guides/img/two-host-step.png}
export TF_CPP_MIN_LOG_LEVEL=2

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c "import tf_crossdevice" 2>/dev/null; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q -e '.[cpu]'
fi
if [ ! -x .venv-viewer/bin/python ]; then
  python3 -m venv .venv-viewer
fi
.venv-viewer/bin/python -m pip install -q \
  tensorboard==2.21.0 tensorboard-plugin-profile==2.24.2 playwright==1.65.2
if [ ! -x /usr/bin/chromium ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
fi

WORK=$(mktemp -d)
TENSORBOARD=""
cleanup() {
  if [ -n "$TENSORBOARD" ]; then kill "$TENSORBOARD" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# The benchmark's training job (benchmarks/training.py): the dense model,
# the default collective; step 30 is well past the first steps' tracing.
.venv/bin/python -m tf_crossdevice.launch --num_workers=2 --emulate_hosts \
  --link_rate=1gbit -- .venv/bin/python examples/train.py \
  --model=dense --width=1024 --depth=4 --batch_size=512 --steps=40 \
  --log_every=20 --job_name=worker --loop=custom \
  --cross_device_ops=CollectiveAllReduce --devices_per_worker=1 \
  --model_dir="$WORK/model" --timeline="$WORK/step.json" --timeline_step=30

PORT=$(.venv/bin/python -c "from tf_crossdevice.cluster import processes; print(processes.free_ports(1)[0])")
.venv-viewer/bin/tensorboard --logdir="$WORK/model" --port="$PORT" \
  >"$WORK/tensorboard.log" 2>&1 &
TENSORBOARD=$!
.venv-viewer/bin/python scripts/trace_viewer_screenshot.py \
  "http://127.0.0.1:$PORT/?run=step30&tag=trace_viewer&hosts=worker0,worker1#profile" \
  "$OUT"
echo "wrote $OUT"
