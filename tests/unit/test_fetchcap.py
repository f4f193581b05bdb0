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


@pytest.mark.parametrize(
    "ratio, k, want",
    [
        (0.05, 128, 6),  # 6.4
        (0.25, 10, 3),  # 2.5: half up
        (0.35, 10, 4),  # 3.4999999999999996 in floats, 3.5 in decimal: half up
        (0.05, 16, 1),  # 0.8
        (0.05, 8, 1),  # 0.4: a positive ratio always admits at least one block
        (0.0, 128, 0),
        (1.0, 128, 128),
        (0.10, 128, 13),  # 12.8
    ],
)
def test_ratio_rounding(ratio, k, want):
    assert ratio_cap(ratio, k) == want
    assert Fixed(ratio).cap(ctx(top_k=k)) == want == Fixed(ratio).max_cap(k)


def test_unlimited_is_k():
    assert Unlimited().cap(ctx(top_k=128)) == 128 and Unlimited().max_cap(64) == 64


@pytest.mark.parametrize(
    "spec, want",
    [
        ("fixed:0.05", Fixed(0.05)),
        ("fixed", Fixed(0.05)),
        (" Fixed : 0.1 ", Fixed(0.1)),
        ("unlimited", Unlimited()),
    ],
)
def test_get_policy_parses(spec, want):
    assert get_policy(spec) == want
    assert get_policy(str(want)) == want  # spec round-trips


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("fixed:abc", "ratio must be a number"),
        ("fixed:1.5", "ratio must be a number in \\[0, 1\\]"),
        ("fixed:-0.1", "ratio must be a number"),
        ("unlimited:3", "takes no argument"),
        ("lru", "unknown policy 'lru'; choices: fixed\\[:RATIO\\], unlimited"),
        (0.05, "expected a string"),
    ],
)
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


# -- LinkBudget: paper eq. 3 as an adaptive cap -------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st

from oasis_core.fetchcap import LinkBudget, register_policy, split_budget  # noqa: E402
from oasis_core.selection import count_missing  # noqa: E402


def budget_ctx(n_missing, *, t=1e-3, link=8192e3, bpbh=8192, weight=1.0, top_k=128):
    """Defaults: 1 ms at 8.192 MB/s over 8 KiB block-heads = a budget of exactly 1 block-head."""
    return CapContext(
        step=2,
        top_k=top_k,
        rows=len(n_missing),
        n_missing=np.asarray(n_missing, dtype=np.int64),
        last_step_time_s=t,
        link_bytes_per_s=link,
        bytes_per_block_head=bpbh,
        row_weight=weight,
    )


def test_split_budget_by_hand():
    # n = [1, 4, 0, 3], N = 8, B = 5: floors of 5n/8 = [0, 2, 0, 1] (3), remainders 5n mod 8 = [5, 4, 0, 7]:
    # the 2 left over go to rows 3 and 0.
    assert split_budget(np.array([1, 4, 0, 3]), 5, 32).tolist() == [1, 2, 0, 2]
    # Budget covers everything: every row gets its missing count (the budget is clamped to N).
    assert split_budget(np.array([1, 4, 0, 3]), 100, 32).tolist() == [1, 4, 0, 3]
    # ... but never above max_cap.
    assert split_budget(np.array([1, 4, 0, 3]), 100, 2).tolist() == [1, 2, 0, 2]
    # The split is over what a row can take (min(n, max_cap)), so a binding max_cap does not waste budget:
    # n = [1, 6], max_cap 1 -> demands [1, 1]; a split over [1, 6] would give [0, 3] -> [0, 1], leaving 1 unused.
    assert split_budget(np.array([1, 6]), 3, 1).tolist() == [1, 1]
    # Equal remainders: lower row first. n = [2, 2, 2], B = 4: floors [1, 1, 1], remainders [2, 2, 2], 1 left.
    assert split_budget(np.array([2, 2, 2]), 4, 32).tolist() == [2, 1, 1]
    # Zero budget: the min_cap floor alone (a missing row is never starved), not above its missing count.
    assert split_budget(np.array([1, 4, 0, 3]), 0, 32, min_cap=2).tolist() == [1, 2, 0, 2]
    assert split_budget(np.array([1, 4, 0, 3]), 0, 32, min_cap=0).tolist() == [0, 0, 0, 0]
    assert split_budget(np.zeros(0, dtype=np.int64), 7, 4).tolist() == []
    assert split_budget(np.zeros(3, dtype=np.int64), 7, 4).tolist() == [0, 0, 0]


def test_link_budget_eq3_by_hand():
    # 30 GB/s x 20 ms x 0.5 = 300 MB; / (8192 B x row_weight 1000) = 36.62 -> 36 block-heads for these rows.
    p = LinkBudget(link_fraction=0.5, min_cap=0, max_ratio=0.25)
    c = budget_ctx([10, 20, 30, 40], t=0.020, link=30e9, weight=1000)
    assert p.budget_blocks(c) == 36
    # max_cap 32: demands [10, 20, 30, 32], N = 92, B = 36: 36n/92 = [3.91, 7.83, 11.74, 12.52] -> floors
    # [3, 7, 11, 12] (33), 3 left to the largest remainders: rows 0, 1, 2.
    assert p.cap(c).tolist() == [4, 8, 12, 12]
    # max_cap = ratio_cap(0.25, 128) = 32; a big budget gives each row its missing blocks up to 32.
    big = budget_ctx([10, 20, 30, 40], t=0.020, link=30e9, weight=1)
    assert p.max_cap(128) == 32 and p.cap(big).tolist() == [10, 20, 30, 32]


def test_link_budget_fallbacks():
    p = LinkBudget()
    assert (p.link_fraction, p.min_cap, p.max_ratio, p.first_ratio) == (1.0, 1, 0.25, 0.05)
    # First step (no step time yet), or link / block bytes unknown: the fixed cap ratio_cap(first_ratio, K).
    assert p.cap(ctx(n_missing=np.array([3, 3, 3, 3]))) == 6
    assert p.cap(CapContext(step=1, top_k=128, rows=4, last_step_time_s=0.02)) == 6
    assert LinkBudget(first_ratio=0.5, max_ratio=0.25).cap(ctx()) == 32  # never above max_cap
    # No n_missing: the budget split evenly. 1 ms x 8.192 GB/s / 8192 B = 1000 blocks over 4 rows -> 250, cap 32.
    c = CapContext(step=2, top_k=128, rows=4, last_step_time_s=1e-3, link_bytes_per_s=8192e6, bytes_per_block_head=8192)
    assert p.cap(c) == 32
    assert p.cap(dataclasses.replace(c, row_weight=100)) == 2  # 10 blocks over 4 rows
    assert p.cap(dataclasses.replace(c, row_weight=1000)) == 1  # 1 block over 4 rows: 0, floored at min_cap 1
    assert LinkBudget(min_cap=0).cap(dataclasses.replace(c, row_weight=1000)) == 0


@pytest.mark.parametrize(
    "spec, want",
    [
        ("budget", LinkBudget()),
        ("budget:0.8", LinkBudget(0.8)),
        (" Budget : 0.8 ", LinkBudget(0.8)),
        ("budget:0.8,min_cap=0,max_ratio=0.5", LinkBudget(0.8, min_cap=0, max_ratio=0.5)),
        ("budget:max_ratio=0.5", LinkBudget(max_ratio=0.5)),
        ("budget:1.5,first_ratio=0.1", LinkBudget(1.5, first_ratio=0.1)),
    ],
)
def test_link_budget_spec_round_trip(spec, want):
    assert get_policy(spec) == want
    assert get_policy(want.spec) == want
    assert not want.static and Fixed().static and Unlimited().static


def test_link_budget_spec_text():
    assert LinkBudget(0.8).spec == "budget:0.8"
    assert LinkBudget(0.8, min_cap=0, max_ratio=0.5).spec == "budget:0.8,min_cap=0,max_ratio=0.5"
    assert get_policy(LinkBudget(0.1234567891).spec) == LinkBudget(0.1234567891)  # more digits than :g keeps


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("budget:abc", "LinkBudget.link_fraction: must be a number, got 'abc'"),
        ("budget:0", "LinkBudget.link_fraction: must be a finite number > 0, got 0.0"),
        ("budget:inf", "LinkBudget.link_fraction: must be a finite number > 0, got inf"),
        ("budget:0.8,min_cap=1.5", "LinkBudget.min_cap: must be an integer, got '1.5'"),
        ("budget:0.8,min_cap=-1", "LinkBudget.min_cap: must be an integer >= 0, got -1"),
        ("budget:0.8,max_ratio=0", "LinkBudget.max_ratio: must be a number in \\(0, 1\\], got 0.0"),
        ("budget:0.8,first_ratio=2", "LinkBudget.first_ratio: must be a number in \\[0, 1\\], got 2.0"),
        ("budget:0.8,speed=3", "'speed=3' is not FIELD=VALUE with FIELD one of"),
        ("budget:0.8,link_fraction=0.5", "link_fraction given twice"),
        ("lru", "choices: fixed\\[:RATIO\\], unlimited, budget\\[:FRACTION\\]"),
    ],
)
def test_link_budget_errors_name_field_and_value(spec, msg):
    with pytest.raises(ValueError, match=msg) as e:
        get_policy(spec)
    assert repr(spec.strip().lower()) in str(e.value) or spec == "lru"


def test_link_budget_validation_and_context_weight():
    with pytest.raises(ValueError, match="LinkBudget.min_cap: must be an integer >= 0, got True"):
        LinkBudget(min_cap=True)
    with pytest.raises(ValueError, match="CapContext.row_weight: must be a finite number > 0, got 0"):
        CapContext(step=0, top_k=8, rows=1, row_weight=0)


def test_register_policy_reaches_get_policy():
    register_policy("drift-boost", "drift-boost", lambda spec, arg: DriftBoost())
    try:
        assert isinstance(get_policy("Drift-Boost"), DriftBoost)
    finally:
        from oasis_core import fetchcap

        fetchcap._REGISTRY.pop("drift-boost")
    with pytest.raises(ValueError, match="register_policy: name"):
        register_policy("a:b", "a:b", lambda spec, arg: Fixed())


def test_link_budget_numpy_equals_torch_without_sync():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    p = LinkBudget(0.7, min_cap=1, max_ratio=0.25)
    for _ in range(50):
        n = rng.integers(0, 40, size=int(rng.integers(1, 30)))
        c = budget_ctx(n, t=float(rng.uniform(1e-4, 5e-2)), link=30e9, weight=float(rng.uniform(1, 5000)))
        want = p.cap(c)
        got = p.cap(dataclasses.replace(c, n_missing=torch.from_numpy(n)))
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_link_budget_drives_plan_step(lib):
    """count_missing (the first pass) -> LinkBudget -> plan_step: the plan moves what the budget allows."""
    resident = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
    pred = np.array([[1, 2, 3, 9], [5, 6, 7, 8], [1, 2, 3, 4]])  # misses 1, 4, 0
    if lib == "torch":
        torch = pytest.importorskip("torch")
        resident, pred = torch.from_numpy(resident), torch.from_numpy(pred)
    xp = namespace(resident)
    n_missing = count_missing(resident, pred)
    assert np.asarray(n_missing).tolist() == [1, 4, 0]
    p = LinkBudget(min_cap=0, max_ratio=1.0)
    # budget 3 blocks: 3n/5 = [0.6, 2.4, 0] -> floors [0, 2, 0], 1 left to row 0.
    c = CapContext(
        step=1,
        top_k=4,
        rows=3,
        n_missing=n_missing,
        last_step_time_s=3e-3,
        link_bytes_per_s=8192e3,
        bytes_per_block_head=8192,
    )
    cap = p.cap(c)
    plan = plan_step(resident, xp.zeros((3, 4), xp.int64, like=resident), pred, cap, 1, p.max_cap(4))
    assert np.asarray(plan.n_fetch).tolist() == [1, 2, 0]
    assert np.asarray(plan.n_missing).tolist() == np.asarray(n_missing).tolist()


@settings(max_examples=300, deadline=None)
@given(
    n=st.lists(st.integers(0, 128), min_size=0, max_size=40),
    t=st.floats(0.0, 0.2),
    link=st.floats(1e6, 1e12),
    weight=st.floats(1.0, 1e5),
    frac=st.floats(0.01, 2.0),
    min_cap=st.integers(0, 8),
    max_ratio=st.sampled_from([0.05, 0.25, 0.5, 1.0]),
    top_k=st.sampled_from([8, 32, 128]),
)
def test_link_budget_properties(n, t, link, weight, frac, min_cap, max_ratio, top_k):
    n = np.minimum(np.asarray(n, dtype=np.int64), top_k)
    p = LinkBudget(frac, min_cap=min_cap, max_ratio=max_ratio)
    bpbh = 8192
    c = budget_ctx(n, t=t, link=link, bpbh=bpbh, weight=weight, top_k=top_k)
    cap = np.asarray(p.cap(c))
    c_max = p.max_cap(top_k)
    assert cap.shape == n.shape and cap.dtype == np.int64
    assert (cap >= 0).all() and (cap <= c_max).all()  # never above max_cap (the buffer width)
    planned = np.minimum(cap, n)  # what plan_step moves (given enough victims)
    budget_bytes = link * t * frac  # eq. 3 for the whole step; these rows stand for `weight` rows each
    floor = np.minimum(n, min(min_cap, c_max)).sum()
    # The budget binds, up to the min_cap floor that takes precedence over it.
    assert planned.sum() * bpbh * weight <= budget_bytes * (1 + 1e-12) + floor * bpbh * weight
    if min_cap == 0:
        assert planned.sum() * bpbh * weight <= budget_bytes * (1 + 1e-12)
    # Work-conserving: the budget is used up unless every row already gets min(n, max_cap).
    b = p.budget_blocks(c)
    assert planned.sum() >= min(b, np.minimum(n, c_max).sum())
