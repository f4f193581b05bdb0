"""``oasis_sim.fitted`` on a hybrid model (issue 36's gap): prediction, selection and copies run on the full-attention
layers only, so their per-layer targets divide by those (``Sample.full``), not by every layer. Samples generated from
known per-full-layer constants must give those constants back; with the windowed layers counted (the old division)
they would come out ``Lf / L`` times too small, which the last assertion shows."""

from dataclasses import replace

import pytest

from oasis_sim.fitted import Sample, fit

L, LF = 18, 3  # Gemma 3 270M: 18 layers, 3 of them full (5, 11, 17)
SIDE_A, SIDE_C = 1.7, 20e-6  # side: a·excess + c per full layer
SEL_A, SEL_C = 1.3, 8e-6
RATE, LAT = 40e9, 10e-6  # copy path: latency + bytes / rate per full layer


def sample(i: int, side_excess: float, sel_excess: float, bytes_per_step: float) -> Sample:
    floor = {"side": 5e-6, "select": 2e-6, "gemm": 1e-5, "attn": 1e-6, "sparse": 0.0, "lm_head": 1e-4}
    feat = {
        "side": floor["side"] + side_excess,
        "select": floor["select"] + sel_excess,
        "gemm": 2e-5,
        "attn": 3e-6,
        "sparse": 0.0,
        "lm_head": 2e-4,
        "step_overhead": 1e-4,
    }
    meas = {
        "pred": LF * (floor["side"] + SIDE_A * side_excess + SIDE_C),
        "select": LF * (floor["select"] + SEL_A * sel_excess + SEL_C),
        "transfer": LF * (LAT + bytes_per_step / LF / RATE),
        "layers": L * 3e-5,
        "stall": 0.0,
        "tpot_mean": L * 3e-5 + 3e-4,
    }
    return Sample(
        f"k{i}", f"p{i}", "sparse", "host", L, feat, meas, bytes_per_step, LAT, background=False, floor=floor, n_full=LF
    )


def test_side_select_and_copy_fits_count_full_layers_only():
    ss = [sample(0, 10e-6, 4e-6, 3e6), sample(1, 40e-6, 9e-6, 12e6), sample(2, 90e-6, 30e-6, 30e6)]
    m = fit(ss)
    ops = m.fits["sparse"]
    assert ops["score"].scale == pytest.approx(SIDE_A, rel=1e-6)
    assert ops["score"].offset_s == pytest.approx(SIDE_C, rel=1e-6)
    assert ops["select"].scale == pytest.approx(SEL_A, rel=1e-6)
    assert ops["select"].offset_s == pytest.approx(SEL_C, rel=1e-6)
    assert m.h2d_bytes_per_s["host"] == pytest.approx(RATE, rel=1e-9)
    # every layer counted (the old division): the per-layer targets shrink by Lf / L and the constants with them
    old = fit([replace(s, n_full=0) for s in ss]).fits["sparse"]
    assert old["score"].offset_s < 0.5 * SIDE_C and old["select"].offset_s < 0.5 * SEL_C


def test_without_windows_every_layer_is_full():
    s = replace(sample(0, 1e-5, 1e-5, 1e6), n_full=0)
    assert s.full == L
