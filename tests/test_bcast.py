"""One plan's numbers take bcast's Python path, a batch's arrays numpy's: both give numpy's values."""

import numpy as np
from hypothesis import given, strategies as st

from simulator import bcast

numbers = st.one_of(st.floats(allow_nan=False, width=64), st.integers(-2**53, 2**53))
arrays = st.lists(st.floats(allow_nan=False, width=64), min_size=1, max_size=5).map(np.array)


@given(numbers, numbers, st.booleans())
def test_one_plan_numbers_give_numpys_values(a, b, cond):
    assert bcast.maximum(a, b) == np.maximum(a, b)
    assert bcast.minimum(a, b) == np.minimum(a, b)
    assert bcast.where(cond, a, b) == np.where(cond, a, b)
    assert bcast.where(np.bool_(cond), a, b) == np.where(cond, a, b)
    assert bcast.as_float(a) == np.asarray(a, dtype=float)
    assert type(bcast.as_float(np.int64(7))) is float


@given(arrays, numbers)
def test_a_batch_takes_numpys_path(x, b):
    assert np.array_equal(bcast.maximum(x, b), np.maximum(x, b))
    assert np.array_equal(bcast.minimum(b, x), np.minimum(b, x))
    assert np.array_equal(bcast.where(x > 0, x, b), np.where(x > 0, x, b))
    assert bcast.amin(x) == np.min(x) and bcast.amax(x) == np.max(x)
    assert bcast.amin(b) == b == bcast.amax(b)
    assert bcast.as_float(x).dtype == np.float64
