"""Replay of recordings in the simulator, the fitted predictor and validation (leave-one-out / held-out)."""

import json
import os

import numpy as np
import pytest
from experiment_scripts import load_script
from replay_fakes import base_config, fake_results, synthetic_recording

from oasis_core.recording import build_recording, find_recordings, load_recording, save_recording, save_selection
from oasis_core.specs import get_hardware, get_model
from oasis_sim import validate as V
from oasis_sim.cli import main
from oasis_sim.fitted import FittedPredictor, OpFit, fit, nnls_relative, recording_key
from oasis_sim.predictor import RooflinePredictor
from oasis_sim.replay import measured_metrics, replay, sim_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMITTED = os.path.join(REPO, "traces", "recordings")


@pytest.fixture(scope="module")
def synth():
    recs = [
        synthetic_recording(mode=m, context=c, concurrency=n)
        for m in ("dense", "lookahead")
        for c in (4096, 16384)
        for n in (4, 16)
    ]
    recs.append(synthetic_recording(mode="lookahead", context=8192, concurrency=8, fetch_ratio=0.1))
    return recs


def test_replay_reproduces_the_configuration():
    rec = build_recording(
        base_config(mode="lookahead", context=8192, concurrency=6, fetch_ratio=0.1, seed=4, steps=9, warmup=3),
        fake_results(),
    )
    cfg = sim_config(rec)
    c = rec.config
    assert (
        cfg.mode,
        cfg.model,
        cfg.hardware,
        cfg.top_k,
        cfg.block_size,
        cfg.fetch_ratio,
        cfg.seed,
        cfg.concurrency,
        cfg.transfer_path,
        cfg.arrival,
    ) == (c["mode"], c["model"], c["hardware"], 128, 16, 0.1, 4, 6, "dma", "closed")
    res = replay(rec)
    log = res.sim.steps
    assert len(res.window) == 9
    assert all(log.decode[i] == 6 and log.prefill[i] == 0 for i in res.window)
    assert res.window[0] == 1 + 3  # one prefill step, three warm-up steps
    durs = [log.dur[i] for i in res.window]
    assert res.predicted["throughput_tok_s"] == pytest.approx(6 * 9 / sum(durs))
    assert res.predicted["pcie_h2d_bytes_per_step"] > 0


def test_replay_uses_recorded_selections(tmp_path):
    kvh, K = get_model("qwen3-8b").n_kv_heads, 128
    rng = np.random.default_rng(0)
    static = np.tile(np.arange(K), (11, kvh, 1))  # never changes: nothing to fetch after the first fill
    churn = np.stack([rng.permutation(512)[:K] for _ in range(11 * kvh)]).reshape(11, kvh, K)
    out = {}
    for name, sets in (("static", static), ("churn", churn)):
        save_selection(tmp_path / f"{name}.sel.npz", sets, [0])
        rec = build_recording(
            base_config(steps=8, warmup=1),
            fake_results(selection_file=f"{name}.sel.npz"),
            source=str(tmp_path / f"{name}.json"),
        )
        save_recording(rec, tmp_path / f"{name}.json")
        res = replay(load_recording(tmp_path / f"{name}.json"))
        assert res.cfg.selection == "replay" and res.cfg.policy_layers == 1
        out[name] = res.predicted["pcie_h2d_bytes_per_step"]
    assert out["static"] == 0.0
    assert out["churn"] > 0.0
    synthetic = replay(load_recording(tmp_path / "churn.json"), use_selection=False)
    assert synthetic.cfg.selection == "synthetic"


def test_fitted_predictor_interface():
    base = RooflinePredictor(get_model("qwen3-8b"), get_hardware("h200"))
    p = FittedPredictor(base, {"gemm_layer": OpFit(2.0, 1e-5), "step_overhead": OpFit(0.0, 7e-4)}, 30e9)
    fl = RooflinePredictor.floor(base.model, base.hw).time("gemm_layer", {"tokens": 8})
    assert p.time("gemm_layer", {"tokens": 8}) == pytest.approx(
        fl + 2 * (base.time("gemm_layer", {"tokens": 8}) - fl) + 1e-5
    )  # twice the roofline's excess over the floor
    assert p.time("step_overhead", {}) == pytest.approx(7e-4)
    assert p.time("attn_decode", {"kv_bytes": 1e9}) == base.time("attn_decode", {"kv_bytes": 1e9})
    with pytest.raises(ValueError, match="unknown op 'gemm'"):
        FittedPredictor(base, {"gemm": OpFit()})


def test_nnls_prefers_a_scale_over_a_constant():
    X = np.array([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])  # constant feature: collinear with the intercept
    c = nnls_relative(X, np.array([4.0, 4.0, 4.0]))
    assert c == pytest.approx([2.0, 0.0])
    c = nnls_relative(np.array([[1.0, 1.0], [3.0, 1.0]]), np.array([3.0, 7.0]))
    assert c == pytest.approx([2.0, 1.0])


def test_validate_leave_one_out_recovers_hidden_truth(synth):
    rep = V.validate(synth)
    assert rep["scheme"] == "leave-one-out" and rep["n_recordings"] == len(synth)
    assert rep["median_abs_err_pct_tpot_p50"] < 1.0 and rep["median_abs_err_pct_throughput"] < 1.0
    assert rep["p90_abs_err_pct_tpot_p50"] < 2.0
    assert rep["roofline_median_abs_err_pct_tpot_p50"] > 10.0  # what calibration buys
    for row in rep["predictors"]["fitted"]["recordings"]:
        fitted_on = row["model"]["fitted_on"]
        assert row["recording"] not in fitted_on and len(fitted_on) == len(synth) - 1
    json.dumps(rep)  # JSON-ready


def test_never_fits_on_the_scored_recording(synth, monkeypatch):
    seen = []
    real_fit = V.fit

    def spy(samples):
        seen.append({s.key for s in samples})
        return real_fit(samples)

    monkeypatch.setattr(V, "fit", spy)
    V.validate(synth[:3], calibrate_from=synth)  # the calibration set holds the scored recordings too
    assert len(seen) == 3
    for rec, keys in zip(synth[:3], seen):
        assert recording_key(rec) not in keys and len(keys) == len(synth) - 1

    def leaky(samples):  # a fit that ignores the exclusion must be refused, not scored
        return real_fit(samples + [V.sample_of(synth[0], replay(synth[0]))])

    monkeypatch.setattr(V, "fit", leaky)
    with pytest.raises(V.LeakError, match="fitted on the recording it would be scored on"):
        V.validate(synth[:1], calibrate_from=synth[1:3])


def test_single_recording_falls_back_to_roofline(synth):
    rep = V.validate(synth[:1])
    r0, r1 = (rep["predictors"][p]["recordings"][0]["metrics"] for p in ("roofline", "fitted"))
    assert r0["tpot_ms_p50"]["predicted"] == r1["tpot_ms_p50"]["predicted"]
    assert rep["predictors"]["fitted"]["recordings"][0]["model"]["fitted_on"] == []


def test_fit_is_per_family(synth):
    model = fit([V.sample_of(r, replay(r)) for r in synth])
    assert set(model.fits) == {"dense", "sparse"}
    assert "score" in model.fits["sparse"] and "score" not in model.fits["dense"]
    assert 15e9 < model.h2d_bytes_per_s["dma"] < 35e9
    assert model.gather_sm_share == {}  # dma: no gather kernel on the GPU, the simulator applies no share


# Hidden transfer settings of the synthetic "hardware" below: UVA gather SM share and copy rate, both away from
# the fit's prior (the configuration's 0.24, the H200's measured 49 GB/s UVA gather).
HIDDEN_SHARE, HIDDEN_RATE = 0.12, 30e9
UVA_CONFIGS = [(n, fr) for n in (4, 8, 16, 32) for fr in (0.02, 0.1)] + [(16, 0.2), (32, 0.05)]


@pytest.fixture(scope="module")
def uva_graph():
    """CUDA-graph-like uva recordings (TPOT and bytes per step, no stage times); the two largest copy volumes are
    copy-bound at the hidden rate, which pins it."""
    return [
        synthetic_recording(
            mode="lookahead",
            context=16384,
            concurrency=n,
            fetch_ratio=fr,
            transfer_path="uva",
            truth_share=HIDDEN_SHARE,
            truth_h2d=HIDDEN_RATE,
            with_stages=False,
        )
        for n, fr in UVA_CONFIGS
    ]


def test_fit_recovers_hidden_gather_share_and_copy_rate_from_tpot(uva_graph):
    assert all(r.results["stage_ms_per_step"] == {} for r in uva_graph)
    model = fit([V.sample_of(r, replay(r)) for r in uva_graph])
    assert model.gather_fit["uva"]["rate_from"] == "tpot"
    assert model.gather_sm_share["uva"] == pytest.approx(HIDDEN_SHARE, abs=0.02)
    assert model.h2d_bytes_per_s["uva"] == pytest.approx(HIDDEN_RATE, rel=0.05)
    p = model.predictor_for(uva_graph[0])
    assert (p.gather_sm_share, p.h2d_bytes_per_s) == (model.gather_sm_share["uva"], model.h2d_bytes_per_s["uva"])
    assert replay(uva_graph[0], p).cfg.gather_sm_share == model.gather_sm_share["uva"]  # reaches the simulator


def test_gather_share_with_measured_copy_rate():
    recs = [
        synthetic_recording(
            mode="lookahead",
            context=16384,
            concurrency=n,
            fetch_ratio=fr,
            transfer_path="uva",
            truth_share=HIDDEN_SHARE,
            truth_h2d=HIDDEN_RATE,
        )
        for n, fr in UVA_CONFIGS[:6]
    ]
    model = fit([V.sample_of(r, replay(r)) for r in recs])
    assert model.gather_fit["uva"]["rate_from"] == "stage times"
    assert model.h2d_bytes_per_s["uva"] == pytest.approx(HIDDEN_RATE, rel=1e-6)  # the stage times' rate, kept
    assert model.gather_sm_share["uva"] == pytest.approx(HIDDEN_SHARE, abs=0.02)


def test_gather_fit_leave_one_out(uva_graph, monkeypatch):
    seen = []
    real_fit = V.fit

    def spy(samples):
        seen.append({s.key for s in samples})
        return real_fit(samples)

    monkeypatch.setattr(V, "fit", spy)
    rep = V.validate(uva_graph)
    assert rep["median_abs_err_pct_tpot_p50"] < 1.0 and rep["p90_abs_err_pct_tpot_p50"] < 5.0
    assert rep["roofline_median_abs_err_pct_tpot_p50"] > 5.0
    assert len(seen) == len(uva_graph)
    for rec, keys, row in zip(uva_graph, seen, rep["predictors"]["fitted"]["recordings"]):
        assert recording_key(rec) not in keys and len(keys) == len(uva_graph) - 1
        assert row["recording"] not in row["model"]["fitted_on"]
        assert 0.0 <= row["model"]["gather_sm_share"]["uva"] <= 0.5


def test_measured_metrics_sums_transfer_stages():
    rec = build_recording(base_config(), fake_results(stage_ms_per_step={"transfer": 3.6, "host_gather": 3.6}))
    m = measured_metrics(rec)
    assert m["layer_ms_transfer"] == pytest.approx(7.2 / 36) and m["layer_ms_pred"] is None


def test_cli_replay_and_validate(tmp_path, synth, capsys):
    paths = []
    for i, rec in enumerate(synth[:3]):
        p = tmp_path / "recs" / f"r{i}.json"
        save_recording(rec, p)
        paths.append(str(p))
    out = tmp_path / "rp"
    assert main(["replay", paths[2], "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tpot_ms_p50" in text and "roofline predictor" in text
    for name in ("timeline.json", "exec_timeline.json", "replay.json", "summary.json"):
        assert (out / name).is_file()
    tl = json.loads((out / "timeline.json").read_text())
    assert any(e.get("ph") == "X" for e in tl["traceEvents"])
    assert main(["replay", paths[2], "--out", str(out), "--calibrate-from", str(tmp_path / "recs")]) == 0
    assert "fitted predictor" in capsys.readouterr().out
    vout = tmp_path / "va"
    assert main(["validate", str(tmp_path / "recs"), "--out", str(vout)]) == 0
    text = capsys.readouterr().out
    assert "median / p90" in text and "leave-one-out" in text
    rep = json.loads((vout / "validate.json").read_text())
    assert rep["n_recordings"] == 3 and "median_abs_err_pct_tpot_p50" in rep


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("oasis-sim: error: ") and "missing.json: cannot read" in err and "\n" not in err
    plain = os.path.join(REPO, "traces", "mooncake_slice.json")
    assert main(["replay", plain, "--out", str(tmp_path / "o")]) == 2
    assert "meta.kind: must be \"oasiskv-recording\"" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["validate", str(tmp_path / "empty")]) == 2
    assert "no recordings found" in capsys.readouterr().err
    bad = build_recording(base_config(), fake_results())
    obj = json.loads(open(save_to(tmp_path / "b.json", bad)).read())
    obj["config"]["model"] = "gpt-9"
    (tmp_path / "b.json").write_text(json.dumps(obj))
    assert main(["replay", str(tmp_path / "b.json"), "--out", str(tmp_path / "o")]) == 2
    assert "b.json: config: model: must be one of" in capsys.readouterr().err


def save_to(path, rec):
    save_recording(rec, path)
    return path


@pytest.mark.skipif(not find_recordings(COMMITTED), reason="no recordings committed under traces/recordings/ yet")
def test_committed_recordings_validate(tmp_path):
    recs = V.load_all([COMMITTED])
    rep = V.validate(recs)
    assert rep["n_recordings"] == len(recs)
    for p in V.PREDICTORS:
        for row in rep["predictors"][p]["recordings"]:
            assert row["metrics"]["tpot_ms_p50"]["predicted"] > 0


def _analysis():
    return load_script("simulator_vs_executor/sim_vs_exec.py")


def test_analysis_with_zero_recordings(tmp_path):
    (tmp_path / "none").mkdir()
    rep = _analysis().run(str(tmp_path / "none"), str(tmp_path / "out"))
    assert rep["n_recordings"] == 0
    assert "No executor recordings" in (tmp_path / "out" / "sim_vs_exec.md").read_text()
    assert not (tmp_path / "out" / "sim_vs_exec.png").exists()


def test_analysis_with_recordings(tmp_path, synth):
    for i, rec in enumerate(synth[:4]):
        save_recording(rec, tmp_path / "recs" / f"r{i}.json")
    rep = _analysis().run(str(tmp_path / "recs"), str(tmp_path / "out"))
    md = (tmp_path / "out" / "sim_vs_exec.md").read_text()
    assert rep["n_recordings"] == 4 and "| r0 |" in md and "leave-one-out" in md
    assert (tmp_path / "out" / "sim_vs_exec.png").stat().st_size > 10_000
    assert "median_abs_err_pct_tpot_p50" in json.loads((tmp_path / "out" / "sim_vs_exec.json").read_text())


def test_record_matrix_dry_run_plans_the_issue_matrix(capsys):
    mod = load_script("simulator_vs_executor/record_matrix.py")
    runs = mod.plan("all")
    assert len(runs) == 12 + 12 + 24
    assert {(m, fr) for m, _c, _n, fr in runs} == {
        ("dense", 0.05),
        ("lookahead", 0.02),
        ("lookahead", 0.05),
        ("lookahead", 0.1),
    }
    assert mod.main(["--dry-run", "--out", "/nonexistent-dir"]) == 0
    out = capsys.readouterr().out
    assert "estimated" in out and "dense-8k-c8" in out and "lookahead-16k-c8-fr0.02" in out
