#!/usr/bin/env bash
# Runs every GPU check of the repository on this machine's GPUs, offline:
#   1. pytest tests/gpu (the contract on GPUs, NCCL against numpy and its
#      fallbacks, hierarchical copy and the other single-host classes on 1 to
#      8 logical GPUs, select_cross_device_ops from the real link matrix,
#      collectives with implementation NCCL); each test that lacks GPUs is
#      skipped with a reason naming how many it needs and how many there are;
#   2. the benchmark's GPU group (python -m benchmarks.gpu), with
#      $GPU_BENCHMARK_FLAGS (default --quick).
# Writes gpu_checks.log, the tests' JUnit XML and the benchmark's records
# (gpu_benchmark/gpu_results.json and .txt) to $OUT if set, else to
# benchmark_results/gpu_checks/.
#
# Python: $PYTHON, else .venv/bin/python if it imports TensorFlow, else
# python3. It needs a CUDA build of TensorFlow 2.21 (pip install
# 'tensorflow[and-cuda]==2.21.0') plus numpy, absl-py, pytest, portpicker and
# psutil; tf_crossdevice is imported from this checkout.
#
# Exit status: 0 all passed, 1 a test failed, 2 a benchmark entry failed,
# 3 no GPU (TensorFlow sees none: nothing was checked on a GPU), 4 no usable
# TensorFlow.
set -uo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
export PYTHONUNBUFFERED=1
# The test processes share each GPU: none may take all of its memory.
export TF_FORCE_GPU_ALLOW_GROWTH=true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR="${OUT:-$PWD/benchmark_results/gpu_checks}"
mkdir -p "$OUT_DIR"
export OUT="$OUT_DIR"  # the nested contract run writes its JUnit XML there
BENCHMARK_FLAGS="${GPU_BENCHMARK_FLAGS-"--quick"}"
LOG="$OUT_DIR/gpu_checks.log"
: >"$LOG"

say() { echo "$@" | tee -a "$LOG"; }

# Prints "cuda" or "cpu" for the TensorFlow that $1 imports; nothing if none.
tf_build() {
  "$1" -c 'import tensorflow as tf
print("cuda" if tf.sysconfig.get_build_info().get("is_cuda_build") else "cpu")' \
    2>/dev/null
}

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  # The first with a CUDA build, else the first with any TensorFlow.
  for candidate in .venv/bin/python python3; do
    case $(tf_build "$candidate") in
      cuda) PY=$candidate && break ;;
      cpu) PY=${PY:-$candidate} ;;
    esac
  done
fi
PY=${PY:-python3}
if [ -z "$(tf_build "$PY")" ]; then
  say "GPU checks: $PY cannot import TensorFlow; install a CUDA build" \
    "(pip install 'tensorflow[and-cuda]==2.21.0') or set PYTHON"
  exit 4
fi

say "== machine"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L 2>&1 | tee -a "$LOG"
fi
GPUS=$("$PY" - <<'EOF' 2>>"$LOG"
import tensorflow as tf

build = tf.sysconfig.get_build_info()
gpus = tf.config.list_physical_devices("GPU")
print(
    f"{len(gpus)} GPU(s) seen by TensorFlow {tf.__version__} "
    f"({'CUDA ' + str(build.get('cuda_version')) if build.get('is_cuda_build') else 'not a CUDA build'})"
)
EOF
)
say "$PY: ${GPUS:-TensorFlow failed to list the GPUs (see $LOG)}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null |
  grep -q '^GPU' && [[ $GPUS == 0\ * ]]; then
  say "GPU checks: nvidia-smi lists GPUs that TensorFlow in $PY does not" \
    "see (is it a CUDA build, matching this driver?)"
fi

say "== pytest tests/gpu"
"$PY" -m pytest tests/gpu -rs -q -p no:cacheprovider \
  --junitxml="$OUT_DIR/gpu_tests.xml" 2>&1 | tee -a "$LOG"
TESTS=${PIPESTATUS[0]}
SUMMARY=$(grep -E '^=* ?[0-9]+ (passed|failed|skipped|error)' "$LOG" | tail -n 1)

say "== python -m benchmarks.gpu $BENCHMARK_FLAGS"
# shellcheck disable=SC2086  # the flags are words
"$PY" -m benchmarks.gpu $BENCHMARK_FLAGS \
  --output_dir="$OUT_DIR/gpu_benchmark" 2>&1 | tee -a "$LOG"
BENCHMARK=${PIPESTATUS[0]}

say "== summary"
say "tests: ${SUMMARY:-no pytest summary} (pytest exit $TESTS)"
say "benchmark: exit $BENCHMARK; records in $OUT_DIR/gpu_benchmark"
if [ "$TESTS" -ne 0 ]; then
  say "GPU checks FAILED: a test failed (see above)"
  exit 1
fi
if [ "$BENCHMARK" -eq 3 ]; then
  say "GPU checks: no GPU here; every GPU test was skipped and nothing was" \
    "measured"
  exit 3
fi
if [ "$BENCHMARK" -ne 0 ]; then
  say "GPU checks FAILED: the benchmark's GPU group (exit $BENCHMARK)"
  exit 2
fi
say "GPU checks passed"
