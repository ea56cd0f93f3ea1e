"""Fixtures of the compat tests."""

import pytest

from tf_crossdevice.compat import _warnings


@pytest.fixture
def forget_warnings(monkeypatch):
    """Lets every legacy name warn again, as in a new process, for one test.

    compat warns once per name per process; a test that looks at the
    warning must not depend on which test used the name first.
    """
    monkeypatch.setattr(_warnings, "_warned", set())
