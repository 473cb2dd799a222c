"""mlactl/util/arrays.py against numpy's own np.unique, its plain second implementation."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlactl.util.arrays import unique

ints = hnp.arrays(np.int64, st.integers(0, 40), elements=st.integers(-5, 5))
floats = hnp.arrays(np.float64, st.integers(0, 40), elements=st.sampled_from([0.0, -0.0, 1.5, np.inf, -np.inf, np.nan]))


@given(st.one_of(ints, floats))
def test_unique_is_np_unique(a):
    want, got = np.unique(a), unique(a)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_unique_of_a_list_and_of_nothing():
    np.testing.assert_array_equal(unique([3, 1, 3, 2]), [1, 2, 3])
    assert unique(np.array([], dtype=np.int64)).size == 0
