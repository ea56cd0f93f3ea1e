"""Entry point of one TensorFlow gRPC worker started by `cluster.py`.

Run as `python -m tf_crossdevice._worker_main --cluster_spec=JSON
--job_name=worker --task_index=I --cpus_per_worker=N`. The worker splits its
CPU into N devices, starts a `tf.distribute.Server`, prints one readiness line
to stdout (`READY_PREFIX` followed by JSON) and serves until it is killed.

The worker also exits when its launcher is gone: with `--exit_on_stdin_eof`
when its stdin reaches end of file (the launcher holds the write end of that
pipe, and the kernel closes it however the launcher dies), and with
`--parent_pid` as soon as its parent process is no longer that pid.

Exit codes: 0 after the launcher went away, `EXIT_BIND_FAILED` when the gRPC
server could not bind its port (the launcher retries with new ports), any
other code is an error whose cause is on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import tensorflow as tf

READY_PREFIX = "tf_crossdevice worker ready: "
EXIT_BIND_FAILED = 75  # EX_TEMPFAIL: the port was taken; retry elsewhere.

# Substrings of TensorFlow's error when the gRPC server cannot listen.
_BIND_ERROR_MARKERS = (
    "could not start grpc server",
    "address already in use",
    "failed to add port",
)


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cluster_spec", required=True, help="JSON dict")
    parser.add_argument("--job_name", default="worker")
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--cpus_per_worker", type=int, default=1)
    parser.add_argument("--exit_on_stdin_eof", action="store_true")
    parser.add_argument("--parent_pid", type=int, default=None)
    return parser.parse_args(argv)


def _exit_when_launcher_goes(parent_pid: int | None, watch_stdin: bool) -> None:
    """Starts daemon threads that end the process when the launcher is gone.

    Both checks, because either can be missed alone: stdin EOF comes at once
    but needs the pipe; the parent pid check (every 0.5 s) also covers a
    pipe that another process still holds open.
    """

    def watch_pipe(stdin_fd: int) -> None:
        # os.read on the descriptor, not sys.stdin: a daemon thread blocked
        # inside a buffered reader aborts interpreter shutdown ("could not
        # acquire lock"). `_run` skips that shutdown too.
        try:
            while os.read(stdin_fd, 4096):
                pass
        finally:
            os._exit(0)

    def watch_parent() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    if watch_stdin:
        threading.Thread(
            target=watch_pipe, args=(sys.stdin.fileno(),), daemon=True
        ).start()
    if parent_pid is not None:
        threading.Thread(target=watch_parent, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Starts the worker and serves until killed; returns an exit code."""
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    _exit_when_launcher_goes(args.parent_pid, args.exit_on_stdin_eof)

    # The server builds its devices from its ConfigProto, not from the eager
    # context: on TF 2.21 set_logical_device_configuration alone leaves the
    # server with one CPU. Both are set so that the worker's own eager
    # context agrees with what the server offers to clients.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpus_per_worker
    )
    config = tf.compat.v1.ConfigProto(
        device_count={"CPU": args.cpus_per_worker}
    )
    # Several workers may share one GPU; none should take all its memory.
    config.gpu_options.allow_growth = True
    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec(json.loads(args.cluster_spec)),
            job_name=args.job_name,
            task_index=args.task_index,
            config=config,
            start=True,
        )
    except tf.errors.OpError as e:
        print(f"failed to start server: {e}", file=sys.stderr)
        if any(m in str(e).lower() for m in _BIND_ERROR_MARKERS):
            return EXIT_BIND_FAILED
        return 1

    ready = {
        "job_name": args.job_name,
        "task_index": args.task_index,
        "target": server.target,
        "devices": {
            "CPU": args.cpus_per_worker,
            "GPU": len(tf.config.list_physical_devices("GPU")),
        },
    }
    print(READY_PREFIX + json.dumps(ready), flush=True)
    server.join()
    return 0


def _run() -> None:
    """Runs `main` and leaves without interpreter shutdown.

    `main` returns only when the server did not start (a lost port race
    included), while the launcher-watching daemon threads may be blocked in
    reads. Finalizing the interpreter under them once aborted a worker under
    load ("Fatal Python error: _enter_buffered_busy ... <stdin>") instead of
    exiting with `EXIT_BIND_FAILED`, which the launcher retries; os._exit
    makes the exit code the one `main` chose.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _run()
