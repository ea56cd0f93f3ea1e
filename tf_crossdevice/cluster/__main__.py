"""`python -m tf_crossdevice.cluster`: local gRPC workers until stopped.

Prints the cluster spec as one JSON line, then runs until SIGTERM or
Ctrl-C (or `--run_seconds`); `--helpshort` lists the flags.
"""

from absl import app

from tf_crossdevice.cluster import _local

if __name__ == "__main__":
    _local._define_flags()
    app.run(_local._main)
