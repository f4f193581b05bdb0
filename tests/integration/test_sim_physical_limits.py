"""The roofline floor of a hardware preset; a fitted predictor is never below it (nor is any fit the recordings
give: tests/integration/test_sim_fit_floor.py), a fitted copy rate above the link is clamped, and a configured one
refused."""

import pytest

from oasis_core.specs import get_hardware, get_model
from oasis_sim.fitted import FittedPredictor, OpFit
from oasis_sim.predictor import OPS, RooflinePredictor


@pytest.fixture
def base():
    return RooflinePredictor(get_model("qwen3-8b"), get_hardware("h100-sxm"))


SHAPES = {
    "gemm_layer": {"tokens": 16384},
    "attn_prefill": {"tokens": 16384, "past_tokens": 0},
    "attn_decode": {"kv_bytes": 3e8},
    "norm_rope": {"tokens": 4096},
    "score": {"summary_bytes": 1e7},
    "topk": {"elements": 1e6},
    "lm_head": {"tokens": 64},
}


def test_floor_is_the_datasheet_peak(base):
    m, hw = base.model, base.hw
    floor = RooflinePredictor.floor(m, hw)
    t = 16384
    layer = m.attn_params_per_layer + m.active_mlp_params_per_layer
    assert floor.time("gemm_layer", {"tokens": t}) == pytest.approx(2 * t * layer / hw.bf16_flops)
    assert floor.time("attn_decode", {"kv_bytes": 3e8}) == pytest.approx(3e8 / hw.hbm_bytes_per_s)
    for op, shape in SHAPES.items():
        assert 0 < floor.time(op, shape) < base.time(op, shape), op


def test_a_fit_is_never_below_the_floor(base):
    floor = RooflinePredictor.floor(base.model, base.hw)
    at_floor = FittedPredictor(base, {op: OpFit(0.0, 0.0) for op in SHAPES})  # the least a fit can say
    as_base = FittedPredictor(base, {op: OpFit(1.0, 0.0) for op in SHAPES})
    for op, shape in SHAPES.items():
        assert at_floor.time(op, shape) == floor.time(op, shape) > 0, op
        assert as_base.time(op, shape) == pytest.approx(base.time(op, shape), rel=1e-12), op
    for bad in ({"scale": -0.1}, {"offset_s": -1e-3}, {"scale": float("nan")}):
        name, value = next(iter(bad.items()))
        with pytest.raises(ValueError, match=f"OpFit.{name}: must be a finite number >= 0"):
            OpFit(**bad)


def test_a_fit_above_the_floor_is_kept(base):
    fp = FittedPredictor(base, {"gemm_layer": OpFit(1.2, 1e-6)})
    shape = SHAPES["gemm_layer"]
    fl = RooflinePredictor.floor(base.model, base.hw).time("gemm_layer", shape)
    assert fp.time("gemm_layer", shape) == pytest.approx(fl + 1.2 * (base.time("gemm_layer", shape) - fl) + 1e-6)
    assert fp.clamp_note() is None and set(SHAPES) <= set(OPS)


def test_a_copy_rate_above_the_link_is_clamped(base):
    link = base.hw.h2d_bytes_per_s
    fp = FittedPredictor(base, {}, h2d_bytes_per_s=3 * link)
    assert fp.h2d_bytes_per_s == link and fp.rate_clamped_from == 3 * link
    assert "copy rate" in fp.clamp_note()
    assert FittedPredictor(base, {}, h2d_bytes_per_s=0.5 * link).h2d_bytes_per_s == 0.5 * link


def test_a_copy_rate_override_above_the_link_is_refused(tmp_path, capsys):
    from sim_cases import QUICK

    from oasis_sim.cli import main

    link = get_hardware("h100-sxm").h2d_bytes_per_s
    assert main(["run", "--out", str(tmp_path), *QUICK, "--h2d-bytes-per-s", str(link * 2)]) == 2
    assert "h2d_bytes_per_s: must be <= the h100-sxm link's" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path), *QUICK, "--h2d-bytes-per-s", str(link * 0.5)]) == 0
