"""Issue 35, newcomer items: ``oasis_core.xp`` offers float64 (docs/policies.md: policies carry float64 state) on
numpy and torch alike; the "needs exact sampling" error says why for every adaptive policy, not "timing" for one
that follows misses or drift."""

import numpy as np
import pytest

from oasis_core.xp import namespace
from oasis_sim.config import ConfigError, make_config


def test_float64_on_numpy_and_torch():
    xp = namespace(np.zeros(2))
    assert xp.float64 is np.float64 and xp.zeros((2,), xp.float64).dtype == np.float64
    torch = pytest.importorskip("torch")
    xt = namespace(torch.zeros(2))
    assert xt.float64 is torch.float64 and xt.zeros((2,), xt.float64, like=torch.zeros(1)).dtype == torch.float64


@pytest.mark.parametrize("spec", ["budget:0.8", "drift", "recall", "per-layer"])
def test_profile_sampling_error_names_the_real_reason(spec):
    with pytest.raises(ConfigError) as e:
        make_config({"fetch_policy": spec, "mode": "lookahead"})
    msg = str(e.value)
    assert "is adaptive" in msg and "misses, drift" in msg and "set policy_sampling=exact" in msg, msg
    assert "adapts to each step's timing" not in msg
