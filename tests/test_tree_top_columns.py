"""A tree level's candidates (tree_drafter.top_columns): each row's k largest columns,
largest first, ties to the lower column, NaN first -- checked against a full sort."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.trees.drafter import top_columns


def _reference(rows: np.ndarray, k: int) -> np.ndarray:
    out = []
    for row in rows:
        key = np.where(np.isnan(row), np.inf, row)  # argmax takes a NaN first
        out.append(np.lexsort((np.arange(row.size), -key))[:min(k, row.size)])
    return np.array(out)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 40), st.integers(1, 5), st.integers(0, 2**31 - 1), st.booleans())
def test_top_columns_are_the_largest_in_order(n_rows, n_cols, k, seed, coarse):
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    if coarse:  # many ties, and tokens the processing ruled out
        rows = np.round(rows)
        rows[rng.random(rows.shape) < 0.3] = -np.inf
    np.testing.assert_array_equal(top_columns(rows, k), _reference(rows, k))


def test_a_nan_is_taken_first_and_the_row_is_not_changed():
    rows = np.array([[0.5, np.nan, 2.0, 1.0], [3.0, 1.0, 3.0, -np.inf]], dtype=np.float32)
    before = rows.copy()
    top = top_columns(rows, 3)
    assert top.tolist() == [[1, 2, 3], [0, 2, 1]]
    np.testing.assert_array_equal(rows, before)


@pytest.mark.parametrize("k", [1, 3])
def test_a_full_size_row(k):
    rows = np.random.default_rng(0).standard_normal((3, 65536)).astype(np.float32)
    np.testing.assert_array_equal(top_columns(rows, k), _reference(rows, k))
