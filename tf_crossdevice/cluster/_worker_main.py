"""Entry point of one TensorFlow gRPC worker started by `cluster._local`.

Run as `python -m tf_crossdevice.cluster._worker_main --cluster_spec=JSON
--job_name=worker --task_index=I --cpus_per_worker=N`. The worker splits its
CPU into N devices, starts a `tf.distribute.Server`, replies once to its
launcher (`processes.reply({"ready": ..., "devices": ...})`) and serves
until it is killed. A SIGTERM does not end it: it records a preemption
notice for the client that drives it (`_notices`) and serves on.

The worker also exits when its launcher is gone: when its stdin reaches end
of file (the launcher holds the write end of that pipe, and the kernel
closes it however the launcher dies) and as soon as its parent is no longer
the launcher (see `processes.exit_when_parent_goes`).

Exit codes: 0 after the launcher went away, `EXIT_BIND_FAILED` when the gRPC
server could not bind its port (the launcher retries with new ports), any
other code is an error whose cause is on stderr.
"""

from __future__ import annotations

import json
import os
import sys

import tensorflow as tf
from absl import app, flags

from tf_crossdevice.cluster import _notices, processes

EXIT_BIND_FAILED = 75  # EX_TEMPFAIL: the port was taken; retry elsewhere.

# Substrings of TensorFlow's error when the gRPC server cannot listen.
_BIND_ERROR_MARKERS = (
    "could not start grpc server",
    "address already in use",
    "failed to add port",
)


def _define_flags() -> None:
    """Defines the worker's flags; only when run as a program, so that
    importing this module (`cluster._local` does) adds no flags to anyone's."""
    flags.DEFINE_string(
        "cluster_spec", None, "The cluster spec as JSON: {job: [host:port]}."
    )
    flags.DEFINE_string("job_name", "worker", "This worker's job.")
    flags.DEFINE_integer(
        "task_index", None, "This worker's task in its job.", lower_bound=0
    )
    flags.DEFINE_integer(
        "cpus_per_worker", 1, "Logical CPU devices to serve.", lower_bound=1
    )
    flags.mark_flags_as_required(["cluster_spec", "task_index"])


def serve(
    cluster_spec: dict[str, list[str]],
    job_name: str,
    task_index: int,
    cpus_per_worker: int,
) -> int:
    """Starts the server, replies that it is ready and serves until killed.

    Returns:
        An exit code, only when the server did not start.
    """
    # The server builds its devices from its ConfigProto, not from the eager
    # context: on TF 2.21 set_logical_device_configuration alone leaves the
    # server with one CPU. Both are set so that the worker's own eager
    # context agrees with what the server offers to clients.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * cpus_per_worker
    )
    config = tf.compat.v1.ConfigProto(device_count={"CPU": cpus_per_worker})
    # Several workers may share one GPU; none should take all its memory.
    config.gpu_options.allow_growth = True
    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec(cluster_spec),
            job_name=job_name,
            task_index=task_index,
            config=config,
            start=True,
        )
    except tf.errors.OpError as e:
        print(f"failed to start server: {e}", file=sys.stderr)
        if any(m in str(e).lower() for m in _BIND_ERROR_MARKERS):
            return EXIT_BIND_FAILED
        return 1

    # A SIGTERM is a preemption notice for the client (see _notices); the
    # launcher stops this process by closing its stdin.
    _notices.record_notices_of(server)
    processes.reply(
        {
            "ready": True,
            "target": server.target,
            "devices": {
                "CPU": cpus_per_worker,
                "GPU": len(tf.config.list_physical_devices("GPU")),
            },
        }
    )
    _notices.wait_forever()


def _main(argv: list[str]) -> None:
    """Runs `serve` and leaves without interpreter shutdown.

    `serve` returns only when the server did not start (a lost port race
    included), while the launcher-watching daemon threads may be blocked in
    reads. Finalizing the interpreter under them once aborted a worker under
    load ("Fatal Python error: _enter_buffered_busy ... <stdin>") instead of
    exiting with `EXIT_BIND_FAILED`, which the launcher retries; os._exit
    makes the exit code the one `serve` chose.
    """
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    processes.exit_when_parent_goes(watch_stdin=True)
    FLAGS = flags.FLAGS  # noqa: N806
    code = serve(
        json.loads(FLAGS.cluster_spec),
        FLAGS.job_name,
        FLAGS.task_index,
        FLAGS.cpus_per_worker,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _define_flags()
    app.run(_main)
