"""experiments/simulator_vs_executor/sim_vs_exec.py's flattened fit parameters: the GEMM group's time per layer in
the fitted form of oasis_sim.fitted, floor + scale * (roofline - floor) + offset (hand-computed here)."""

import pytest
from experiment_scripts import load_script


@pytest.fixture(scope="module")
def sve():
    return load_script("simulator_vs_executor/sim_vs_exec.py")


def _desc(dense=None, sparse=None):
    fits = {fam: {"gemm_layer": g} for fam, g in (("dense", dense), ("sparse", sparse)) if g is not None}
    return {"fits": fits, "gather_sm_share": {"uva": 0.25}, "h2d_gb_s": {"uva": 40.0}}


def test_gemm_layer_time_is_floor_plus_scaled_excess_plus_offset(sve):
    p = sve._model_params(
        _desc(dense={"scale": 2.0, "offset_us": 30.0}, sparse={"scale": 0.5, "offset_us": 0.0}), 0.40, 0.10
    )
    assert p["dense_gemm_layer_ms"] == pytest.approx(0.10 + 2.0 * 0.30 + 0.030)
    assert p["sparse_gemm_layer_ms"] == pytest.approx(0.10 + 0.5 * 0.30)
    assert (p["dense_gemm_scale"], p["dense_gemm_offset_us"]) == (2.0, 30.0)
    assert (p["uva_gather_sm_share"], p["uva_copy_gb_s"]) == (0.25, 40.0)


def test_without_a_fit_the_layer_takes_the_roofline_time_and_never_goes_below_the_floor(sve):
    p = sve._model_params(_desc(sparse={"scale": 0.0, "offset_us": 0.0}), 0.40, 0.10)
    assert p["dense_gemm_layer_ms"] == pytest.approx(0.40)  # no dense fit: scale 1, offset 0 = the roofline
    assert p["sparse_gemm_layer_ms"] == pytest.approx(0.10)  # scale 0 keeps the floor, not 0
    below = sve._model_params(_desc(dense={"scale": 3.0, "offset_us": 0.0}), 0.05, 0.10)
    assert below["dense_gemm_layer_ms"] == pytest.approx(0.10)  # a roofline under its floor: no negative excess
