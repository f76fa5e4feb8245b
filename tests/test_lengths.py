"""Per-request values (mbbatch.lengths): the forms the kernels take, and
equal-mass bin edges."""

import numpy as np
import pytest
import scipy.stats as st

from mbbatch._kernels import common
from mbbatch.lengths import as_service


@pytest.mark.parametrize("dist, kind", [(st.uniform(1, 19), common.SVC_UNIFORM), (st.expon(scale=3), common.SVC_EXPON),
                                        (st.lognorm(0.8, scale=2), common.SVC_LOGNORM),
                                        (st.gamma(2.0, scale=1.5), common.SVC_GAMMA),
                                        (st.weibull_min(1.5, scale=4), common.SVC_WEIBULL_MIN)])
def test_distributions_drawn_in_the_kernel(dist, kind):
    spec = as_service(dist)
    assert spec.kind == kind and spec.mean == pytest.approx(dist.mean())
    e = spec.equal_mass_edges(4)
    np.testing.assert_allclose(dist.cdf(e[1:-1]), [0.25, 0.5, 0.75], rtol=1e-9)
    assert (e[0], e[-1]) == spec.support


def test_arrays_are_replayed_with_quantile_edges():
    v = np.arange(1.0, 101.0)
    spec = as_service(v)
    assert spec.kind == common.SVC_REPLAY and spec.mean == 50.5 and spec.support == (1.0, 100.0)
    np.testing.assert_array_equal(spec.equal_mass_edges(2), np.quantile(v, [0, 0.5, 1]))
    with pytest.raises(ValueError, match="atoms"):
        as_service(np.ones(10)).equal_mass_edges(2)


def test_unsupported_inputs_are_named():
    with pytest.raises(TypeError, match="output must be a continuous distribution"):
        as_service(st.poisson(3), "output")
    with pytest.raises(TypeError, match="prompt must be a 1-D sequence of real numbers"):
        as_service("uniform", "prompt")
