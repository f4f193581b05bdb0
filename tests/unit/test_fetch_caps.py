"""The executor's fetch caps (oasis_exec.workingset.fetch_caps) against the core's numpy policies: the device-side step time
and budget give the caps the numpy policy gives for the same step time, on random inputs; static policies stay
plain ints (the kernels' scalar path, as before the policies ran on the executor)."""

import numpy as np
import pytest
import torch

from oasis_core.fetchcap import CapContext, Fixed, LinkBudget, Unlimited, get_policy, split_budget
from oasis_core.selection import count_missing
from oasis_exec.config import ExecConfig
from oasis_exec.workingset.fetch_caps import DeviceCaps, StepClock

CPU = torch.device("cpu")


def _rows(rng, R, S, K, n_blocks=40):
    res = np.full((R, S), -1, dtype=np.int64)
    pred = np.full((R, K), -1, dtype=np.int64)
    for r in range(R):
        n = int(rng.integers(0, S + 1))
        res[r, rng.permutation(S)[:n]] = rng.permutation(n_blocks)[:n]
        m = int(rng.integers(0, K + 1))
        pred[r, :m] = rng.permutation(n_blocks)[:m]
    return res, pred


def test_link_budget_with_a_device_step_time_equals_the_host_float():
    rng = np.random.default_rng(0)
    for i in range(60):
        p = LinkBudget(float(rng.uniform(0.1, 2.0)), min_cap=int(rng.integers(0, 3)), max_ratio=0.5)
        R = int(rng.integers(1, 40))
        n = rng.integers(0, 20, size=R)
        t = float(rng.integers(1, 10**8)) * 1e-9  # what the step clock gives: whole nanoseconds
        ctx = CapContext(
            step=3,
            top_k=32,
            rows=R,
            n_missing=n if i % 4 else None,
            last_step_time_s=t,
            link_bytes_per_s=float(rng.uniform(5e9, 60e9)),
            bytes_per_block_head=8192,
            row_weight=float(rng.integers(1, 64)),
        )
        want = np.broadcast_to(np.asarray(p.cap(ctx)), (R,))
        dev = CapContext(
            **{
                **ctx.__dict__,
                "last_step_time_s": torch.tensor(t, dtype=torch.float64),
                "n_missing": None if ctx.n_missing is None else torch.from_numpy(n),
            }
        )
        got = p.cap(dev)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.int64 and got.shape == (R,)
        assert got.tolist() == want.tolist(), (i, p, t)
        assert int(p.budget_blocks(dev)) == p.budget_blocks(ctx)


def test_split_budget_takes_a_0d_budget():
    rng = np.random.default_rng(1)
    for _ in range(40):
        n = rng.integers(0, 30, size=int(rng.integers(1, 25)))
        b = int(rng.integers(-5, 200))
        want = split_budget(n, b, 16, 1)
        assert split_budget(torch.from_numpy(n), torch.tensor(b), 16, 1).tolist() == want.tolist()
        assert split_budget(n, np.int64(b), 16, 1).tolist() == want.tolist()


def _caps(policy, L=3):
    return DeviceCaps(
        policy=policy, top_k=8, n_layers=L, bytes_per_block_head=2 * 16 * 64 * 2, link_bytes_per_s=25e9, device=CPU
    )


@pytest.mark.parametrize("policy, cap", [(Fixed(0.25), 2), (Fixed(1.0), 8), (Unlimited(), 8)])
def test_static_policies_give_the_plain_int_and_run_no_clock(policy, cap):
    c = _caps(policy)
    assert c.fixed == cap == c.max_cap and not c.adaptive and c.clock is None
    c.step_start()
    c.step_end()
    c.layer_ready(0)
    res, pred = _rows(np.random.default_rng(2), 6, 8, 8)
    assert c.cap(1, torch.from_numpy(res), torch.from_numpy(pred)) == cap


def test_adaptive_caps_follow_the_step_clock_like_the_numpy_policy():
    rng = np.random.default_rng(3)
    p = LinkBudget(0.5, min_cap=0, max_ratio=0.5)
    c = _caps(p, L=3)
    res, pred = _rows(rng, 12, 8, 8)
    first = c.cap(0, torch.from_numpy(res), torch.from_numpy(pred))  # no step has ended: the fixed first cap
    assert first == p.cap(CapContext(step=0, top_k=8, rows=12)) == 1  # ratio_cap(0.05, 8)
    for step in range(8):
        c.step_start()
        c.step_end()  # the host clock on CPU: ns[1] = the span, seconds = ns[1] * 1e-9
        ns = int(c.clock.ns[1])
        assert ns >= 0 and float(c.clock.seconds) == ns * 1e-9
        c.clock.ns[1] = int(rng.integers(10**5, 10**8))  # a random step time, as the GPU clock would write it
        c.clock.seconds.copy_(c.clock.ns[1])
        c.clock.seconds.mul_(1e-9)
        for layer in range(3):
            c.layer_ready(layer)
            res, pred = _rows(rng, 12, 8, 8)
            got = c.cap(layer, torch.from_numpy(res), torch.from_numpy(pred))
            want = p.cap(
                CapContext(
                    step=step + 1,
                    top_k=8,
                    rows=12,
                    n_missing=count_missing(res, pred),
                    last_step_time_s=int(c.clock.ns[1]) * 1e-9,
                    link_bytes_per_s=25e9,
                    bytes_per_block_head=c.bytes_per_block_head,
                    row_weight=3.0,
                )
            )
            assert isinstance(got, torch.Tensor) and got.tolist() == want.tolist(), (step, layer)
            assert int(got.max()) <= c.max_cap


def test_a_layer_reads_its_own_copy_of_the_step_time():
    c = _caps(LinkBudget(), L=2)
    c.step_start()
    c.step_end()
    c.clock.seconds.fill_(0.25)
    c.layer_ready(0)
    assert c.layer_s.tolist() == [0.25, 0.0]  # layer 1 keeps the old time until its transfer was waited for


def test_step_clock_counts_host_nanoseconds_on_cpu():
    clk = StepClock(device=CPU)
    assert not clk.ticked
    clk.start()
    t0 = int(clk.ns[0])
    clk.end()
    assert clk.ticked and int(clk.ns[0]) == t0 and int(clk.ns[1]) >= 0


def test_exec_config_fetch_policy():
    assert ExecConfig(device="cpu").cap_policy() == Fixed(0.05)
    assert ExecConfig(device="cpu", fetch_ratio=0.1).cap_policy() == Fixed(0.1)
    assert ExecConfig(device="cpu", fetch_policy="budget:0.8").cap_policy() == get_policy("budget:0.8")
    assert ExecConfig(device="cpu", mode="retrieval", fetch_policy="budget").cap_policy() == Unlimited()
    with pytest.raises(ValueError, match=r"ExecConfig.fetch_policy: .*unknown policy 'fast'.*got 'fast'"):
        ExecConfig(device="cpu", fetch_policy="fast")
    with pytest.raises(ValueError, match=r"ExecConfig.link_gb_s: must be > 0, got 0"):
        ExecConfig(device="cpu", link_gb_s=0)
