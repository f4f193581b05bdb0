"""The simulator's tensor parallelism (``SimConfig.tensor_parallel``): it simulates rank 0's share of the model
(``oasis_core.specs.tp_local``) and adds two all-reduces a layer (predictor op ``all_reduce``)."""

from __future__ import annotations

import pytest

from oasis_core.specs import get_model, tp_local
from oasis_core.trace import Trace, TraceRequest
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.predictor import RooflinePredictor
from oasis_sim.sim import simulate


def test_rank_zero_holds_the_larger_share():
    s = tp_local(get_model("smollm2-135m"), 2)
    assert (s.n_q_heads, s.n_kv_heads, s.mlp_hidden, s.hidden) == (6, 2, 768, 576)
    r1 = tp_local(get_model("smollm2-135m"), 2, rank=1)
    assert (r1.n_q_heads, r1.n_kv_heads) == (3, 1)
    assert tp_local(get_model("qwen3-8b"), 1) is get_model("qwen3-8b")


def test_config_refuses_what_it_does_not_model():
    with pytest.raises(ConfigError, match="tensor_parallel"):
        SimConfig(model="tiny", tensor_parallel=3)  # 2 KV heads
    with pytest.raises(ConfigError, match="split=none"):
        SimConfig(tensor_parallel=2, split="rpf")


def test_all_reduce_is_a_ring_over_nvlink():
    p = RooflinePredictor(get_model("qwen3-8b"), SimConfig().hardware_spec)
    assert p.time("all_reduce", {"bytes": 1e9, "ranks": 1}) == 0.0
    two = p.time("all_reduce", {"bytes": 1e9, "ranks": 2})
    assert two == pytest.approx(15e-6 + 1e9 / (450e9 * 0.8))
    assert p.time("all_reduce", {"bytes": 1e9, "ranks": 4}) == pytest.approx(15e-6 + 1.5e9 / (450e9 * 0.8))


def _decode(tp, mode):
    reqs = tuple(TraceRequest(id=i, arrival_s=0.0, prompt_tokens=16384, output_tokens=16) for i in range(16))
    cfg = SimConfig(
        model="qwen3-8b",
        hardware="h200",
        mode=mode,
        tensor_parallel=tp,
        arrival="closed",
        concurrency=16,
        timeline_steps=0,
    )
    return simulate(cfg, Trace(requests=reqs)).summary


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_two_ranks_halve_the_kv_and_add_the_all_reduces(mode):
    one, two = _decode(1, mode), _decode(2, mode)
    assert two["tpot_ms_p50"] < one["tpot_ms_p50"]  # half the weights and KV read a step, per GPU
    assert two["hbm_peak_bytes"] < one["hbm_peak_bytes"]
    if mode == "lookahead":
        assert two["h2d_bytes"] == pytest.approx(one["h2d_bytes"] / 2, rel=0.1)  # each rank fetches its own heads
