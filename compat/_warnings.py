"""Deprecation warnings, each at most once per process.

Python's `warnings` filters still decide whether a warning shows (and can
silence it); this module only keeps a legacy name that a program uses a
thousand times from warning a thousand times.
"""

from __future__ import annotations

import threading
import warnings

_warned: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, stacklevel: int = 3) -> None:
    """Warns `message` (a DeprecationWarning) unless `key` already warned.

    Args:
        key: what the warning is about; one warning per key per process.
        message: the warning's text.
        stacklevel: as for `warnings.warn`; the default points at the caller
            of the function that calls this one.
    """
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel)
