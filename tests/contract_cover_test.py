"""The contract's pairwise cover: every pair of values of any two factors
appears in some case, in far fewer cases than the whole product."""

from __future__ import annotations

import itertools

import pytest

from tests import contract


def missing_pairs(rows, factors) -> set:
    """(i, value, j, value) of the pairs that no row of `rows` holds."""
    missing = set()
    for i, j in itertools.combinations(range(len(factors)), 2):
        seen = {(row[i], row[j]) for row in rows}
        for a, b in itertools.product(factors[i], factors[j]):
            if (a, b) not in seen:
                missing.add((i, a, j, b))
    return missing


@pytest.mark.parametrize("test_name", sorted(contract.MATRIX_TESTS))
def test_every_pair_of_factor_values_is_covered(test_name):
    names = contract.MATRIX_TESTS[test_name]
    factors = [[v for v, _ in contract.FACTORS[n]] for n in names]
    rows = contract.pairwise(factors)
    assert missing_pairs(rows, factors) == set()
    # The two largest factors bound it below: kind (5) x mode (3).
    assert len(rows) >= 15
    assert len(rows) <= {"test_reduce": 16, "test_gather": 15}[test_name]


def test_a_missing_pair_is_found():
    factors = [(0, 1), ("a", "b"), (True, False)]
    rows = contract.pairwise(factors)
    assert len(rows) == 4  # Of the product's 8: each pair exactly once.
    first = rows[0]
    assert missing_pairs(rows[1:], factors) == {
        (0, first[0], 1, first[1]),
        (0, first[0], 2, first[2]),
        (1, first[1], 2, first[2]),
    }


def test_exhaustive_cases_are_the_whole_product_with_readable_ids():
    cases = contract.matrix_cases(contract.MATRIX_TESTS["test_reduce"], True)
    assert len(cases) == 2 * 2 * 5 * 2 * 3
    assert cases[0].id == "reduce-mean-none-dense-eager"
    assert cases[0].values == (False, "mean", "none", False, "eager")
    pairwise = contract.matrix_cases(
        contract.MATRIX_TESTS["test_reduce"], False
    )
    assert len({c.id for c in pairwise}) == len(pairwise) == 16
