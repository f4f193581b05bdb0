"""experiments/simulator_vs_executor/records_to_recordings.py: H200 bench records (committed JSONL) -> recordings that load and replay."""

import json
import os

import pytest
from experiment_scripts import load_script

from oasis_core.recording import find_recordings, load_recording
from oasis_sim.replay import measured_metrics, replay

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXP = os.path.join(REPO, "experiments")
FINAL = os.path.join(EXP, "dense_vs_lookahead_throughput", "results", "headline_fused_ab.jsonl")
PATHS = os.path.join(EXP, "transfer_paths", "results", "uva_vs_host_in_step.jsonl")


def _load(name):
    return load_script(f"simulator_vs_executor/{name}.py")


@pytest.fixture(scope="module")
def r2r():
    return _load("records_to_recordings")


def _pick(path, labels, out):
    """The lines of ``path`` whose label is in ``labels`` (every status), written to ``out``."""
    with open(path) as f:
        lines = [x for x in f if x.strip() and json.loads(x).get("label") in labels]
    out.write_text("".join(lines))
    return str(out)


def test_dense_and_lookahead_records_load_and_replay(tmp_path, r2r):
    src = _pick(
        FINAL,
        {"16k-dense-8", "16k-lookahead-16", "16k-lookahead-16-notransfer", "16k-lookahead-16-unfused"},
        tmp_path / "final.jsonl",
    )
    res = r2r.convert([src], str(tmp_path / "fused"), str(tmp_path / "unfused"), log=lambda *_: None)
    written = {w["label"]: w for w in res["written"]}
    assert set(written) == {"16k-dense-8", "16k-lookahead-16", "16k-lookahead-16-unfused"}
    assert written["16k-lookahead-16-unfused"]["set"] == "unfused"
    skipped = {s["label"]: s["reason"] for s in res["skipped"] if not s.get("quiet")}
    assert list(skipped) == ["16k-lookahead-16-notransfer"] and "no-transfer" in skipped["16k-lookahead-16-notransfer"]
    # one JSON per kept record, named label_commit; the fused-off twin only in its own folder; no .npz
    assert sorted(os.path.basename(p) for p in find_recordings(tmp_path / "fused")) == [
        "16k-dense-8_0fc50ce.json",
        "16k-lookahead-16_0fc50ce.json",
    ]
    assert [os.path.basename(p) for p in find_recordings(tmp_path / "unfused")] == [
        "16k-lookahead-16-unfused_0fc50ce.json"
    ]
    assert not list(tmp_path.rglob("*.npz"))
    log = [json.loads(x) for x in (tmp_path / "fused" / r2r.LOG_NAME).read_text().splitlines()]
    assert {e["label"] for e in log} == {"16k-dense-8", "16k-lookahead-16", "16k-lookahead-16-notransfer"}

    with open(src) as f:
        bench = {r["label"]: r for r in map(json.loads, f) if r["status"] == "ok"}
    dense = load_recording(tmp_path / "fused" / "16k-dense-8_0fc50ce.json")
    la = load_recording(tmp_path / "fused" / "16k-lookahead-16_0fc50ce.json")
    assert dense.config["mode"] == "dense" and dense.config["transfer_path"] is None
    assert dense.config["kv_budget_gb"] == 52.0 and dense.config["hardware"] == "h200"
    b = bench["16k-lookahead-16"]
    # transfer=auto resolved to the UVA path; the program count and fused flag kept in meta
    assert la.config["transfer_path"] == "uva" and la.config["exec_transfer"] == "auto"
    assert la.trace.meta["bench_uva_programs"] == b["uva_programs"] and la.trace.meta["bench_fused_ops"] is True
    assert la.config["concurrency"] == 16 and la.config["context"] == 16384 and la.config["steps"] == b["steps"]
    assert la.results["tpot_ms_p50"] == b["tpot_ms_p50"] and la.results["commit"] == "0fc50ce"
    assert la.results["bytes_per_step"]["pcie_h2d"] == pytest.approx(b["bytes_moved_per_step"])
    assert la.selection_path() is None
    for rec in (dense, la):
        res = replay(rec)
        assert res.predicted["tpot_ms_p50"] > 0 and len(res.window) == rec.config["steps"]
        meas = measured_metrics(rec)
        assert res.predicted["pcie_h2d_bytes_per_step"] == pytest.approx(
            meas["pcie_h2d_bytes_per_step"], rel=0.02, abs=1.0
        )


def test_graph_mode_only_and_exec_config(tmp_path, r2r):
    src = _pick(PATHS, {"c8-uva8-graph", "c8-uva8-profile", "c8-host16-eager"}, tmp_path / "tp.jsonl")
    res = r2r.convert([src], str(tmp_path / "out"), log=lambda *_: None)
    assert [w["label"] for w in res["written"]] == ["c8-uva8-graph"]
    reasons = {s["label"]: s["reason"] for s in res["skipped"]}
    assert "profiled" in reasons["c8-uva8-profile"] and "eager" in reasons["c8-host16-eager"]
    with open(src) as f:
        rec = next(r for r in map(json.loads, f) if r["label"] == "c8-uva8-graph")
    cfg = r2r.exec_config_of(rec)
    assert (
        cfg.mode,
        cfg.transfer,
        cfg.uva_programs,
        cfg.fetch_ratio,
        cfg.kv_budget_gb,
        cfg.no_transfer,
        cfg.fused_ops,
        cfg.cuda_graph,
    ) == ("lookahead", "uva", 8, 0.05, 52.0, False, True, True)
    assert r2r.classify({"status": "started", "label": "x"})[0] is None
    assert r2r.classify(dict(rec, fused_ops=False))[0] == "unfused"
    assert r2r.classify({"status": "ok", "label": "x"})[1].startswith("not a bench record")


def test_sim_vs_exec_against_an_old_calibration(tmp_path, r2r):
    src = _pick(FINAL, {"16k-dense-8", "16k-dense-12", "16k-lookahead-16"}, tmp_path / "final.jsonl")
    r2r.convert([src], str(tmp_path / "new"), log=lambda *_: None)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("dense-16k-c8", "lookahead-16k-c16-fr0.05"):
        src_old = os.path.join(REPO, "traces", "recordings", f"{name}.json")
        if not os.path.exists(src_old):
            pytest.skip("old recordings not committed")
        (old / f"{name}.json").write_text(open(src_old).read())
    mod = _load("sim_vs_exec")
    rep = mod.run(
        str(tmp_path / "new"),
        str(tmp_path / "out"),
        "fused",
        calibrate_from=str(old),
        set_aside=("16k-dense-12_0fc50ce",),
    )
    assert rep["n_recordings"] == 3 and rep["n_calibration"] == 2
    assert set(rep["predictors"]) == set(mod.EXT_PREDICTORS)
    assert rep["provenance"]["record_commits"] == ["0fc50ce"]
    assert rep["provenance"]["calibration_commits"] == ["1ea9b23"]
    # the old calibration predates the fused kernels: it predicts the new steps slower than measured
    assert rep["predictors"]["old_fit"]["summary"]["median_signed_err_pct_tpot_p50"] > 10
    assert rep["set_aside"]["recordings"] == ["16k-dense-12_0fc50ce"]
    md = (tmp_path / "out" / "fused.md").read_text()
    assert "old fit (not refitted)" in md and "| 16k-lookahead-16_0fc50ce |" in md
    assert (tmp_path / "out" / "fused.json").exists() and (tmp_path / "out" / "fused.png").exists()
