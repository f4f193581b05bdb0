"""Fetch-cap policies: the paper default, rounding, parsing, and an adaptive policy written against the interface."""
import dataclasses

import numpy as np
import pytest

from oasis_core.fetchcap import CapContext, FetchCapPolicy, Fixed, Unlimited, get_policy, ratio_cap
from oasis_core.selection import plan_step
from oasis_core.xp import namespace


def ctx(top_k=128, rows=4, **kw):
    return CapContext(step=3, top_k=top_k, rows=rows, **kw)


def test_paper_default_is_six_blocks_at_k_128():
    p = Fixed()
    assert p.ratio == 0.05
    assert p.cap(ctx()) == 6 and p.max_cap(128) == 6  # 6.4 rounds half up to 6


@pytest.mark.parametrize("ratio, k, want", [
    (0.05, 128, 6),   # 6.4
    (0.25, 10, 3),    # 2.5: half up
    (0.35, 10, 4),    # 3.4999999999999996 in floats, 3.5 in decimal: half up
    (0.05, 16, 1),    # 0.8
    (0.05, 8, 1),     # 0.4: a positive ratio always admits at least one block
    (0.0, 128, 0),
    (1.0, 128, 128),
    (0.10, 128, 13),  # 12.8
])
def test_ratio_rounding(ratio, k, want):
    assert ratio_cap(ratio, k) == want
    assert Fixed(ratio).cap(ctx(top_k=k)) == want == Fixed(ratio).max_cap(k)


def test_unlimited_is_k():
    assert Unlimited().cap(ctx(top_k=128)) == 128 and Unlimited().max_cap(64) == 64


@pytest.mark.parametrize("spec, want", [
    ("fixed:0.05", Fixed(0.05)), ("fixed", Fixed(0.05)), (" Fixed : 0.1 ", Fixed(0.1)), ("unlimited", Unlimited()),
])
def test_get_policy_parses(spec, want):
    assert get_policy(spec) == want
    assert get_policy(str(want)) == want  # spec round-trips


@pytest.mark.parametrize("spec, msg", [
    ("fixed:abc", "ratio must be a number"),
    ("fixed:1.5", "ratio must be a number in \\[0, 1\\]"),
    ("fixed:-0.1", "ratio must be a number"),
    ("unlimited:3", "takes no argument"),
    ("lru", "unknown policy 'lru'; choices: fixed\\[:RATIO\\], unlimited"),
    (0.05, "expected a string"),
])
def test_get_policy_errors_name_the_problem(spec, msg):
    with pytest.raises(ValueError, match=msg):
        get_policy(spec)


def test_validation():
    with pytest.raises(ValueError, match="Fixed.ratio"):
        Fixed(2.0)
    with pytest.raises(ValueError, match="CapContext.step"):
        CapContext(step=-1, top_k=8, rows=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx().step = 4
    with pytest.raises(TypeError):
        FetchCapPolicy()


class DriftBoost(FetchCapPolicy):
    """An adaptive policy as a researcher would write it: rows that drifted more this step get a larger cap."""

    def max_cap(self, top_k):
        return 4

    def cap(self, ctx):
        xp = namespace(ctx.n_missing)
        two = xp.full((), 2, xp.int64, like=ctx.n_missing)
        four = xp.full((), 4, xp.int64, like=ctx.n_missing)
        return xp.where(ctx.n_missing > 2, four, two)

    @property
    def spec(self):
        return "drift-boost"


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_adaptive_per_row_cap_drives_plan_step(lib):
    resident = np.array([[1, 2, 3, 4], [1, 2, 3, 4]])
    pred = np.array([[1, 2, 3, 9], [5, 6, 7, 8]])  # row 0 misses 1 block, row 1 misses 4
    if lib == "torch":
        torch = pytest.importorskip("torch")
        resident, pred = torch.from_numpy(resident), torch.from_numpy(pred)
    pol = DriftBoost()
    # n_missing would come from a first pass; here it is known by construction.
    xp = namespace(resident)
    n_missing = xp.asarray(np.array([1, 4]), like=resident)
    cap = pol.cap(CapContext(step=1, top_k=4, rows=2, n_missing=n_missing))
    p = plan_step(resident, xp.zeros((2, 4), xp.int64, like=resident), pred, cap, step=1, max_cap=pol.max_cap(4))
    assert np.asarray(p.n_fetch).tolist() == [1, 4]
    assert np.asarray(cap).tolist() == [2, 4]
