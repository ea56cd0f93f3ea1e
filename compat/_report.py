"""The migration command's report: one finding per change or problem.

A `Finding` is one report line: a change, something left for a person, or a
file that does not parse. Plain Python: the command imports this module
before it knows whether libcst is installed.
"""

from __future__ import annotations

import dataclasses
import enum
import re

# The longest code a report line quotes.
_REPORT_WIDTH = 80


class Kind(enum.Enum):
    """What a report line says about a piece of code."""

    CHANGED = "changed"
    NOT_CONVERTED = "not converted"
    CANNOT_PARSE = "cannot parse"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One report line: a change, or something left for a person.

    Attributes:
        line: the line in the original file.
        kind: what happened.
        message: "OLD -> NEW" for a change, "WHAT (WHY)" otherwise.
    """

    line: int
    kind: Kind
    message: str

    def report_line(self, path: str) -> str:
        """`PATH:LINE: changed OLD -> NEW` or `PATH:LINE: KIND: MESSAGE`.

        >>> Finding(3, Kind.CHANGED, "a -> b").report_line("x.py")
        'x.py:3: changed a -> b'
        >>> Finding(4, Kind.NOT_CONVERTED, "f (why)").report_line("x.py")
        'x.py:4: not converted: f (why)'
        """
        separator = " " if self.kind is Kind.CHANGED else ": "
        return f"{path}:{self.line}: {self.kind.value}{separator}{self.message}"


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """The rewritten code of one module and its report, in line order."""

    code: str
    findings: tuple[Finding, ...]

    def count(self, kind: Kind) -> int:
        return sum(finding.kind is kind for finding in self.findings)


class ParseError(ValueError):
    """The code is not Python that libcst can parse."""

    def __init__(self, line: int, message: str):
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


def one_line(code: str) -> str:
    """Code for a report line: one line, at most _REPORT_WIDTH characters.

    >>> one_line("f(\\n    a,\\n    b,\\n)")
    'f(a, b)'
    """
    text = " ".join(code.split())
    text = re.sub(r"([(\[{]) ", r"\1", text)
    text = re.sub(r",? ([)\]}])", r"\1", text)
    if len(text) > _REPORT_WIDTH:
        text = text[: _REPORT_WIDTH - 3] + "..."
    return text
