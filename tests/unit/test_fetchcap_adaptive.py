"""The adaptive policies (oasis_core.fetchcap_drift / _layers / _recall): hand-worked cases, hysteresis on a
synthetic context shift, the per-layer budget, spec round-trips, and numpy == torch with no host synchronisation."""

import contextlib

import numpy as np
import pytest

from oasis_core.fetchcap import CapContext, get_policy, ratio_cap, state_array
from oasis_core.fetchcap_drift import DriftAdaptive
from oasis_core.fetchcap_layers import PerLayer
from oasis_core.fetchcap_recall import RecallTarget
from oasis_core.selection import plan_step


def _ctx(policy, n, p, K=128, layer=None, layers=1, row_state=None, layer_state=None):
    return CapContext(
        step=1,
        top_k=K,
        rows=len(n),
        n_missing=n,
        n_predicted=p,
        layer=layer,
        layers=layers,
        row_state=row_state,
        layer_state=layer_state,
    )


def _drive_drift(policy, misses, K=100):
    """One row, n_predicted = K, n_missing = misses[t]: the cap of each step."""
    st = state_array(policy.row_state_init(K), 1)
    out = []
    for m in misses:
        c = policy.cap(_ctx(policy, np.array([m]), np.array([K]), K=K, row_state=st))
        out.append(int(c[0]))
    return out


def test_drift_hysteresis_on_a_context_shift():
    p = DriftAdaptive(low=0.05, high=0.15, alpha=0.5, ratio=0.05, min_ratio=0.02, max_ratio=0.25)
    # K = 100: start 5, bounds [2, 25]. Stable (2% missing) for 20 steps, a shift (40%) for 10, stable again.
    caps = _drive_drift(p, [2] * 20 + [40] * 10 + [2] * 60)
    assert caps[:4] == [4, 3, 2, 2] and set(caps[3:20]) == {2}  # a stable working set shrinks to min_cap
    # ema after the jump: 0.02 -> 0.21 (> high): the cap doubles on the first shifted step, then keeps growing.
    assert caps[20] == 4 and caps[21] == 8 and caps[23] == 25 and set(caps[23:30]) == {25}
    # Back to stable: ema 0.40 -> 0.21 -> 0.115 (dead band: held) -> 0.0675 (held) -> 0.04375 (< low: shrinks).
    assert caps[30:33] == [25, 25, 25] and caps[33] == 24
    assert caps[-1] == 2 and caps.index(2, 30) == 33 + 22  # 1 block a step down to min_cap


def test_drift_dead_band_holds_and_bounds():
    p = DriftAdaptive(low=0.05, high=0.15, alpha=1.0)
    assert _drive_drift(p, [10] * 5) == [5] * 5  # 10% sits between the thresholds: the start cap is held
    assert _drive_drift(p, [0, 0, 0, 0]) == [4, 3, 2, 2]  # never below ratio_cap(min_ratio)
    assert max(_drive_drift(p, [90] * 10)) == p.max_cap(100) == 25
    with pytest.raises(ValueError, match="DriftAdaptive.cap: needs CapContext.row_state"):
        p.cap(CapContext(step=1, top_k=8, rows=1, n_missing=np.array([1])))


def test_recall_target_by_hand_and_after_the_plan():
    p = RecallTarget(0.9, max_ratio=1.0)
    # allowed = floor(0.1 * n_pred) = [1, 0, 2]: caps n_missing - allowed, clipped at 0.
    c = p.cap(_ctx(p, np.array([3, 0, 1]), np.array([10, 5, 20]), K=20))
    assert c.tolist() == [2, 0, 0]
    rng = np.random.default_rng(0)
    for _ in range(30):  # after plan_step (victims to spare) the recall of the predicted set is >= the target
        R, K, S = 6, 8, 16
        pred = np.stack([rng.permutation(30)[:K] for _ in range(R)])
        res = np.stack([rng.permutation(30)[:S] for _ in range(R)])
        n = np.array([np.setdiff1d(pred[r], res[r]).size for r in range(R)])
        cap = p.cap(_ctx(p, n, np.full(R, K), K=K))
        plan = plan_step(res, np.zeros_like(res), pred, cap, 1, p.max_cap(K))
        recall = [np.isin(pred[r], plan.resident[r]).mean() for r in range(R)]
        assert min(recall) >= 0.9 and (cap <= n).all()


def test_per_layer_shares_follow_drift_under_the_budget():
    p = PerLayer(0.05, alpha=1.0, max_ratio=0.5)
    K, L, per = 100, 4, 3  # budget: ratio_cap(0.05, 100) = 5 per row on average, 20 over the 4 layers
    st = state_array(p.layer_state_init(K), L)
    n = np.array([0, 0, 0, 1, 1, 1, 0, 0, 0, 30, 30, 30])  # layer 3 drifts, layer 1 a little
    cap = p.cap(_ctx(p, n, np.full(12, K), K=K, layers=L, layer_state=st))
    # weights floor(64 * mean) + 1 = [1, 65, 1, 1921]: shares of 20 -> [0, 1, 0, 19], clipped to max_cap 50.
    assert p.shares(st[:, 0], K, L).tolist() == [0, 1, 0, 19]
    assert cap.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0, 19, 19, 19]
    assert cap.sum() <= ratio_cap(0.05, K) * L * per


@pytest.mark.parametrize("seed", range(5))
def test_per_layer_budget_is_respected_per_call_and_per_step(seed):
    rng = np.random.default_rng(seed)
    p = PerLayer(0.1, alpha=0.5)
    K, L, per = 64, 6, 5
    whole = state_array(p.layer_state_init(K), L)
    calls = state_array(p.layer_state_init(K), L)
    budget = ratio_cap(0.1, K) * per * L
    for _ in range(20):
        n = rng.integers(0, 40, size=L * per)
        cap = p.cap(_ctx(p, n, np.full(L * per, K), K=K, layers=L, layer_state=whole))
        assert np.minimum(cap, n).sum() <= budget and (cap <= p.max_cap(K)).all()
        # one call per layer (the executor): the same moving averages once every layer planned
        for layer in range(L):
            part = n[layer * per : (layer + 1) * per]
            c = p.cap(_ctx(p, part, np.full(per, K), K=K, layer=layer, layers=L, layer_state=calls))
            assert np.minimum(c, part).sum() <= ratio_cap(0.1, K) * L * per
        np.testing.assert_allclose(calls, whole)


@pytest.mark.parametrize(
    "spec, want",
    [
        ("drift", DriftAdaptive()),
        ("drift:low=0.1,high=0.3,alpha=0.5", DriftAdaptive(low=0.1, high=0.3, alpha=0.5)),
        ("per-layer", PerLayer()),
        ("per-layer:0.1,min_cap=1,max_ratio=0.5", PerLayer(0.1, min_cap=1, max_ratio=0.5)),
        ("recall:0.9", RecallTarget(0.9)),
        ("recall:0.99,max_ratio=1", RecallTarget(0.99, max_ratio=1.0)),
    ],
)
def test_adaptive_spec_round_trip(spec, want):
    assert get_policy(spec) == want and get_policy(want.spec) == want and not want.static


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("drift:low=0.3,high=0.2", "DriftAdaptive.low: must be below high=0.2, got 0.3"),
        ("drift:alpha=x", "DriftAdaptive.alpha: must be a number, got 'x'"),
        ("drift:speed=1", "'speed=1' is not FIELD=VALUE with FIELD one of low, high"),
        ("per-layer:0", "PerLayer.ratio: must be a number in \\(0, 1\\], got 0.0"),
        ("per-layer:0.1,min_cap=-1", "PerLayer.min_cap: must be an integer >= 0, got -1"),
        ("recall:2", "RecallTarget.target: must be a number in \\[0, 1\\], got 2.0"),
        ("recall:0.9,target=0.8", "target given twice"),
    ],
)
def test_adaptive_errors_name_field_and_value(spec, msg):
    with pytest.raises(ValueError, match=msg) as e:
        get_policy(spec)
    assert repr(spec) in str(e.value)


@contextlib.contextmanager
def _no_host_reads(torch):
    """Every way a tensor's value reaches the host raises (the CPU stand-in for the CUDA sync debug mode)."""
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
    saved = {k: getattr(torch.Tensor, k) for k in names}

    def boom(*a, **k):
        raise AssertionError("host read of a tensor value")

    try:
        for k in names:
            setattr(torch.Tensor, k, boom)
        yield
    finally:
        for k, v in saved.items():
            setattr(torch.Tensor, k, v)


POLICIES = [
    DriftAdaptive(alpha=0.4),
    PerLayer(0.1, alpha=0.5, min_cap=1),
    RecallTarget(0.93, max_ratio=0.5),
]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.spec)
@pytest.mark.parametrize("per_layer_calls", [False, True])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_numpy_equals_torch_without_sync(policy, per_layer_calls, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the GPU machine with `pytest -m gpu`)")
    dev = torch.device(device)
    rng = np.random.default_rng(7)
    K, L, per = 32, 4, 6
    R = L * per
    rs, ls = policy.row_state_init(K), policy.layer_state_init(K)
    np_row = state_array(rs, R) if rs else None
    np_lay = state_array(ls, L) if ls else None
    like = torch.empty(0, device=dev)
    t_row = state_array(rs, R, like=like) if rs else None
    t_lay = state_array(ls, L, like=like) if ls else None
    for step in range(25):
        n = rng.integers(0, K + 1, size=R)
        pr = np.maximum(n, rng.integers(0, K + 1, size=R))
        tn, tp = torch.from_numpy(n).to(dev), torch.from_numpy(pr).to(dev)
        calls = (
            [(layer, slice(layer * per, (layer + 1) * per)) for layer in range(L)]
            if per_layer_calls
            else [(None, slice(0, R))]
        )
        for layer, sl in calls:
            rows = sl.stop - sl.start

            def ctx(nm, pp, row, lay, layer=layer, sl=sl, rows=rows, step=step):
                return CapContext(
                    step=step,
                    top_k=K,
                    rows=rows,
                    n_missing=nm[sl],
                    n_predicted=pp[sl],
                    layer=layer,
                    layers=L,
                    row_state=None if row is None else row[sl],
                    layer_state=lay,
                )

            want = np.broadcast_to(np.asarray(policy.cap(ctx(n, pr, np_row, np_lay))), (rows,))
            if device == "cuda":
                torch.cuda.set_sync_debug_mode("error")
                guard = contextlib.nullcontext()
            else:
                guard = _no_host_reads(torch)
            try:
                with guard:
                    got = policy.cap(ctx(tn, tp, t_row, t_lay))
            finally:
                if device == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
            assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.device.type == dev.type
            assert got.cpu().tolist() == want.tolist(), (step, layer)
            assert int(got.max()) <= policy.max_cap(K) and int(got.min()) >= 0
        # float64 state: equal on the CPU; on CUDA to the last bits (a fused multiply-add rounds once, seen on the
        # H200 for per-layer's moving average); the integer caps above are compared exactly
        tol = dict(rtol=1e-12, atol=0) if device == "cuda" else dict(rtol=0, atol=0)
        if np_row is not None:
            np.testing.assert_allclose(t_row.cpu().numpy(), np_row, **tol)
        if np_lay is not None:
            np.testing.assert_allclose(t_lay.cpu().numpy(), np_lay, **tol)
