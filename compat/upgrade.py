"""Migrates legacy cross-device code to TensorFlow 2.21 and tf_crossdevice.

In the spirit of TensorFlow's tf_upgrade_v2::

    python -m tf_crossdevice.compat.upgrade PATH... [--in_place]

PATH is a file or a folder (every *.py below it). The command rewrites the
names of `tf.contrib.distribute`, its `cross_tower_ops` module and
`tf_crossdevice.compat` (and a few early TF 2 names) to their replacements
(see `_names.LEGACY` and `_names.CONTRIB_ONLY`), prints a unified diff of
each changed file, then one report line per change and per thing it left
for a person, and a summary.
It writes files only with --in_place. Exit status: 0 when every file
parsed, 1 when some did not (they are reported and skipped), 2 for a usage
error.

The rewriting (compat/_rewrite.py) needs libcst, which keeps comments and
formatting; libcst is optional (the `upgrade` extra), so this module imports
the rewriting only when it runs, and says how to install libcst if missing.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import io
import pathlib
import sys
import tokenize
from collections.abc import Iterable, Sequence
from typing import TextIO

from ._report import Finding, Kind, ParseError, Rewrite

__all__ = [
    "NEEDS_LIBCST",
    "PROG",
    "FileUpgrade",
    "main",
    "python_files",
    "upgrade_code",
    "upgrade_file",
]

PROG = "python -m tf_crossdevice.compat.upgrade"
NEEDS_LIBCST = (
    f"{PROG} needs libcst: pip install libcst "
    "(from a checkout of tf_crossdevice: pip install -e '.[upgrade]')"
)
# Folders a project walk never wants: environments, VCS data, caches, Bazel.
_SKIPPED_FOLDERS = frozenset({".venv", ".git", "__pycache__"})


def python_files(paths: Iterable[str]) -> list[pathlib.Path]:
    """The files to upgrade: each file as given, each folder's *.py below it.

    A folder's files come sorted; .venv, .git, __pycache__ and bazel-*
    folders are skipped. A file listed twice is upgraded once.

    Raises:
        FileNotFoundError: a path does not exist (the error names it).

    >>> python_files(["no/such/file.py"])
    Traceback (most recent call last):
    ...
    FileNotFoundError: no/such/file.py: no such file or directory
    """
    files: dict[pathlib.Path, None] = {}
    for name in paths:
        path = pathlib.Path(name)
        if path.is_dir():
            for found in sorted(path.rglob("*.py")):
                folders = found.relative_to(path).parts[:-1]
                if not any(_skipped(folder) for folder in folders):
                    files.setdefault(found)
        elif path.exists():
            files.setdefault(path)
        else:
            raise FileNotFoundError(f"{name}: no such file or directory")
    return list(files)


def _skipped(folder: str) -> bool:
    return folder in _SKIPPED_FOLDERS or folder.startswith("bazel-")


def upgrade_code(code: str) -> Rewrite:
    """Upgrades one module's source; `.code` is the new source.

    Raises:
        ImportError: libcst is not installed.
        _report.ParseError: `code` does not parse.

    >>> result = upgrade_code(
    ...     "from tensorflow.contrib import distribute\\n"
    ...     "spec = distribute.AllReduceSpecTuple('pscpu', 1, -1)  # all\\n"
    ... )
    >>> print(result.code, end="")
    spec = ('pscpu', 1, -1)  # all
    >>> for finding in result.findings:
    ...     print(finding.report_line("train.py"))
    train.py:1: changed from tensorflow.contrib import distribute -> \
(removed, no uses left)
    train.py:2: changed distribute.AllReduceSpecTuple('pscpu', 1, -1) -> \
('pscpu', 1, -1)
    """
    from . import _rewrite  # Needs libcst, an optional dependency.

    return _rewrite.rewrite(code)


@dataclasses.dataclass(frozen=True)
class FileUpgrade:
    """One file's outcome.

    Attributes:
        path: the path as the report shows it.
        old: the file's text ("" when it could not be read).
        new: the upgraded text (`old` when nothing changed or it did not
            parse).
        encoding: the file's encoding (PEP 263), used to write it back.
        findings: its report lines.
        parsed: False when it could not be decoded or parsed.
    """

    path: str
    old: str
    new: str
    encoding: str
    findings: tuple[Finding, ...]
    parsed: bool

    @property
    def changed(self) -> bool:
        return self.new != self.old

    def diff(self) -> str:
        """The unified diff from old to new ("" when unchanged)."""
        lines = difflib.unified_diff(
            self.old.splitlines(keepends=True),
            self.new.splitlines(keepends=True),
            f"a/{self.path}",
            f"b/{self.path}",
        )
        return "".join(
            line if line.endswith("\n") else line + "\n" for line in lines
        )


def upgrade_file(path: pathlib.Path) -> FileUpgrade:
    """Reads and upgrades one file; writes nothing.

    A file that cannot be decoded or parsed gives a "cannot parse" finding.
    """
    from . import _rewrite  # Needs libcst, an optional dependency.

    raw = path.read_bytes()
    encoding = "utf-8"
    old = ""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
        old = raw.decode(encoding)
        result = _rewrite.rewrite(old)
    except (SyntaxError, LookupError) as error:  # A bad coding cookie.
        line = getattr(error, "lineno", None) or 1
        return _unparsable(path, old, encoding, line, str(error))
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        return _unparsable(
            path, old, encoding, line, f"not {encoding}: {error}"
        )
    except ParseError as error:
        return _unparsable(path, old, encoding, error.line, error.message)
    return FileUpgrade(
        str(path), old, result.code, encoding, result.findings, True
    )


def _unparsable(
    path: pathlib.Path, old: str, encoding: str, line: int, message: str
) -> FileUpgrade:
    finding = Finding(line, Kind.CANNOT_PARSE, message)
    return FileUpgrade(str(path), old, old, encoding, (finding,), False)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Rewrites TF 1's tf.contrib.distribute cross-device code and "
            "tf_crossdevice.compat names to TensorFlow 2.21 and "
            "tf_crossdevice. Prints a diff and a report; writes files only "
            "with --in_place."
        ),
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a Python file, or a folder (every *.py below it)",
    )
    parser.add_argument(
        "--in_place",
        action="store_true",
        help="write the upgraded files back",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns its exit status (0, 1 or 2).

    Args:
        argv: the arguments after the program name (default: sys.argv[1:]).

    >>> main(["no/such/folder"])
    2
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error.
        return exit_.code if isinstance(exit_.code, int) else 2
    if importlib.util.find_spec("libcst") is None:
        print(NEEDS_LIBCST, file=sys.stderr)
        return 2
    try:
        files = python_files(args.paths)
    except FileNotFoundError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    upgrades = [upgrade_file(path) for path in files]
    if args.in_place:
        for upgrade in upgrades:
            if upgrade.changed:
                pathlib.Path(upgrade.path).write_bytes(
                    upgrade.new.encode(upgrade.encoding)
                )
    _print_report(upgrades, sys.stdout)
    return 0 if all(upgrade.parsed for upgrade in upgrades) else 1


def _print_report(upgrades: Sequence[FileUpgrade], out: TextIO) -> None:
    for upgrade in upgrades:
        out.write(upgrade.diff())
    counts = dict.fromkeys(Kind, 0)
    for upgrade in upgrades:
        for finding in upgrade.findings:
            print(finding.report_line(upgrade.path), file=out)
            counts[finding.kind] += 1
    changed = sum(upgrade.changed for upgrade in upgrades)
    print(
        f"{len(upgrades)} files scanned, {changed} files changed, "
        f"{counts[Kind.CHANGED]} changes, "
        f"{counts[Kind.NOT_CONVERTED]} not converted, "
        f"{counts[Kind.CANNOT_PARSE]} unparsable",
        file=out,
    )


if __name__ == "__main__":
    sys.exit(main())
