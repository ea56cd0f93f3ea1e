"""pytest_tests: one py_test per tests/*_test.py, each run through pytest."""

_RUNNER = "tests/bazel_pytest_main.py"

def pytest_tests(
        deps,
        slow = [],
        multiprocess = [],
        long = [],
        wiring = [],
        data = {}):
    """Declares a py_test, named after the file, for every tests/*_test.py.

    Each runs tests/bazel_pytest_main.py, which runs pytest on that one file
    from the runfiles root (so conftest.py and pytest.ini apply). A new test
    file needs no BUILD edit unless it belongs in one of the lists below.

    Args:
      deps: what every test depends on.
      slow: tests tagged "slow" (exactly the files that use pytest.mark.slow;
        tests/bazel_tags_test.py checks). .bazelrc leaves them out by default.
      multiprocess: tests that start worker processes: tagged "multiprocess"
        (left out by --config=quick), "exclusive" (run alone: beside another
        TensorFlow test on few cores, workers can miss their start-up
        deadlines) and "requires-network" (they talk over 127.0.0.1).
      long: other tests that need more than a medium test's 5 minutes.
      wiring: tests tagged "wiring", as paths under tests/ without ".py"
        (e.g. "core/checks_test"): the only ones, with //:doctest, that
        .bazelrc's default `bazel test` runs; `--config=full` runs all.
      data: extra runfiles by test name, e.g. another test file it imports.
    """
    files = native.glob(["tests/**/*_test.py"])
    names = [f.split("/")[-1][:-len(".py")] for f in files]
    for name in slow + multiprocess + long + list(data):
        if name not in names:
            fail("pytest_tests: no tests/%s.py for the name '%s'" % (name, name))
    for path in wiring:
        if "tests/%s.py" % path not in files:
            fail("pytest_tests: no tests/%s.py for the wiring test" % path)
    wiring_names = [path.split("/")[-1] for path in wiring]
    for name, src in zip(names, files):
        tags = []
        if name in wiring_names:
            tags.append("wiring")
        if name in slow:
            tags.append("slow")
        if name in multiprocess:
            tags += ["exclusive", "multiprocess", "requires-network"]
        native.py_test(
            name = name,
            # "large" (15 minutes) for the tests that start workers or train.
            size = "large" if tags or name in long else "medium",
            srcs = [_RUNNER, src],
            main = _RUNNER,
            args = [src],
            data = data.get(name, []),
            tags = tags,
            deps = deps,
        )
