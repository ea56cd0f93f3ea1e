"""conftest.py's scheduling groups: the tests that share a module-scoped
setup (one group per parameter of it), which `--dist loadgroup` keeps on
one xdist worker."""

import conftest

pytest_plugins = ["pytester"]


def test_tests_sharing_a_module_setup_form_one_group_per_parameter(pytester):
    pytester.makepyfile(
        test_shared="""
        import pytest

        @pytest.fixture(scope="module", params=[2, 3])
        def cluster(request):
            return request.param

        @pytest.fixture(scope="module")
        def results(cluster):
            return cluster

        @pytest.fixture(scope="module")
        def other():
            return 1

        def test_a(results):
            pass

        def test_b(cluster):
            pass

        def test_c(other):
            pass

        def test_d(tmp_path_factory, tmp_path):
            pass

        @pytest.mark.parametrize("x", [1, 2])
        def test_e(x):
            pass
        """
    )
    items, _ = pytester.inline_genitems()
    groups = dict(
        zip(
            [i.nodeid.split("::")[-1] for i in items],
            conftest.shared_setup_groups(items),
            strict=True,
        )
    )
    assert groups["test_a[2]"] == groups["test_b[2]"]
    assert groups["test_a[3]"] == groups["test_b[3]"]
    assert (
        len({groups["test_a[2]"], groups["test_a[3]"], groups["test_c"]}) == 3
    )
    assert None not in (groups["test_a[2]"], groups["test_c"])
    # pytest's own fixtures and parameters alone share no setup.
    assert [groups[n] for n in ("test_d", "test_e[1]", "test_e[2]")] == [
        None
    ] * 3
