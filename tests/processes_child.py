"""A tiny child for processes_test: does what each JSON command says.

Run as `python -m tests.processes_child [--worker]` from the repository
root (processes_test starts it through `_processes.start_module`). With
`--worker` it acts like a cluster worker: it reads no commands, watches
stdin for end of file, replies {"ready": true} once and sleeps. Otherwise it
answers these commands:

    {"echo": X}             prints a plain line, then replies {"echo": X}
    {"print": TEXT}         prints TEXT as a plain stdout line
    {"fail": CODE, "stderr": TEXT}   writes TEXT to stderr, exits with CODE
    {"spawn_sleeper": true} starts a grandchild in a session of its own (out
                            of reach of killpg) and replies {"pid": PID}
    {"start_child": ARGS, "then": COMMAND}
                            starts another processes_child through the layer
                            with ARGS, sends it COMMAND (if not null), waits
                            for its answer and replies {"pid": PID}
    {"ignore_sigterm": true}  ignores SIGTERM from now on, replies {}
    {"block": true}         replies {}, then sleeps without reading stdin
"""

from __future__ import annotations

import importlib.util
import pathlib
import signal
import subprocess
import sys
import time

from absl import app, flags

_ROOT = pathlib.Path(__file__).resolve().parents[1]

# The layer alone, without tf_crossdevice/__init__.py (which imports
# TensorFlow), so that these children start in a fraction of a second.
_spec = importlib.util.spec_from_file_location(
    "_processes", _ROOT / "tf_crossdevice" / "cluster" / "processes.py"
)
assert _spec is not None and _spec.loader is not None
_processes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_processes)

_WORKER = flags.DEFINE_bool(
    "worker", False, "Read no commands; exit at end of stdin."
)

_SLEEPER = "import time\nwhile True: time.sleep(1)"


def main(argv: list[str]) -> None:
    del argv
    _processes.exit_when_parent_goes(watch_stdin=_WORKER.value)
    if _WORKER.value:
        _processes.reply({"ready": True})
        while True:
            time.sleep(1)
    children = []  # Kept referenced: a Child stops itself at exit only.
    for command in _processes.commands():
        if "echo" in command:
            print("plain chatter, not an answer", flush=True)
            _processes.reply({"echo": command["echo"]})
        elif "print" in command:
            print(command["print"], flush=True)
        elif "fail" in command:
            sys.stderr.write(command["stderr"])
            sys.stderr.flush()
            sys.exit(command["fail"])
        elif "spawn_sleeper" in command:
            sleeper = subprocess.Popen(
                [sys.executable, "-c", _SLEEPER], start_new_session=True
            )
            _processes.reply({"pid": sleeper.pid})
        elif "start_child" in command:
            child = _processes.start_module(
                "tests.processes_child", *command["start_child"], cwd=_ROOT
            )
            children.append(child)
            if command["then"] is not None:
                child.send(command["then"])
            child.receive(timeout=60)
            _processes.reply({"pid": child.pid})
        elif "ignore_sigterm" in command:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _processes.reply({})
        elif "block" in command:
            _processes.reply({})
            while True:
                time.sleep(1)


if __name__ == "__main__":
    app.run(main)
