"""The headline sweep runner (experiments/dense_vs_lookahead_throughput/h200_headline.py) and its report (experiments/dense_vs_lookahead_throughput/dense_vs_lookahead_report.py) on the CPU: the plan
and its estimate (--dry-run), a tiny sweep (guard skip, died run, resume, variants, twins), the report's sections."""

import json
import os

import pytest
from experiment_scripts import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The host-memory guard's margin for the CPU sweeps: their pools are a few MB, so the H200 host's 12 GB default
# made them depend on how much memory other jobs of the machine held (skipped runs failed the tests under load)
FREE = ("--min-free-gb", "0.5")


def _load(name):
    return load_script(f"dense_vs_lookahead_throughput/{name}.py")


def _lines(path):
    return [json.loads(x) for x in open(path)]


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, capsys):
    H = _load("h200_headline")
    out = tmp_path / "plan.jsonl"
    assert H.main(["--out", str(out), "--dry-run", "--fused-ab", "--assume-mem-gb", "262"]) == 0
    text = capsys.readouterr().out
    assert not out.exists()
    plan = [
        ln.split("plan ", 1)[1].split()[0] for ln in text.splitlines() if "] plan " in ln and "(headline)" not in ln
    ]
    # dense first (the budget's maximum from the engine: 21 at 16K, 10 at 32K), anchors, then lookahead by pool size
    assert plan[:4] == ["16k-dense-8", "16k-dense-8-unfused", "16k-dense-12", "16k-dense-16"]
    assert "16k-dense-21" in plan and "32k-dense-10" in plan and "16k-dense-32-h200" in plan
    assert "32k-dense-8-h200" in plan
    first_la = [p for p in plan if "lookahead" in p][:2]
    assert first_la == ["16k-lookahead-88", "32k-lookahead-44"]
    assert plan.index("16k-lookahead-64-notransfer") == plan.index("16k-lookahead-64") + 1
    assert plan.index("16k-lookahead-16-unfused") > plan.index("16k-lookahead-16")
    assert all(p.startswith("16k") for p in plan if p.endswith(("drift2", "drift4", "fr0.02", "fr0.1")))
    assert {"16k-lookahead-80-drift4", "16k-lookahead-8-fr0.1", "16k-lookahead-88-drift2"} <= set(plan)
    # one pinning for both contexts (the 16K pool of 88 holds the 32K pool of 44)
    assert "pins at most 215.7 GB, once" in text  # requests of 4 + 24 chains of 8 (ExecConfig.decode_chain)
    assert "dense lanes at 52 GB = 21" in text and "dense lanes at 52 GB = 10" in text
    assert "(alternative: not run once one ran)" in text and "estimate:" in text


def test_dense_and_lookahead_maxima_are_the_engines(tmp_path):
    H = _load("h200_headline")
    from oasis_exec.config import ExecConfig
    from oasis_exec.engine.engine import Engine

    geo = H.Geometry("tiny", "cpu", steps=3, warmup=1)
    for mode, budget in (("dense", 0.004), ("lookahead", 0.02)):
        n = geo.lanes(mode, 64, budget)
        cfg = ExecConfig(
            model="tiny",
            device="cpu",
            dtype="float32",
            mode=mode,
            selection="synthetic",
            max_context=geo.max_context(64),
            kv_budget_gb=budget,
        )
        eng = Engine(cfg)
        assert 1 < n == eng.max_lanes
        eng.close()
    q = H.Geometry("qwen3-8b", "cuda", steps=24, warmup=4)
    assert q.lanes("dense", 16384, 52) == 21 and q.lanes("dense", 32768, 52) == 10
    assert abs(q.per_request_gb(16384) - 2.42) < 0.01 and abs(q.per_request_gb(32768) - 4.84) < 0.01


@pytest.mark.slow
def test_cpu_sweep_resume_and_report(tmp_path):
    H, R = _load("h200_headline"), _load("dense_vs_lookahead_report")
    out = tmp_path / "sweep.jsonl"
    # a run that took an earlier process down: recorded as an error, never run again
    out.write_text(json.dumps({"label": "c64-lookahead-2-drift4", "status": "started"}) + "\n")
    args = [
        "--out",
        str(out),
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--contexts",
        "64",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--dense-n",
        "2,3",
        "--anchors",
        "2",
        "--la-n",
        "1,2",
        "--max-n",
        "1000000000,3",
        "--nt-n",
        "2",
        "--sens-n",
        "all",
        "--variants",
        "drift2,drift4,fr0.1",
        "--fused-ab",
        *FREE,
    ]
    assert H.main(args) == 0
    recs = _lines(out)
    final = {r["label"]: r for r in recs if r["status"] != "started"}
    # the 10^9 candidate's pool cannot fit any host: skipped by the guard, the next candidate wins
    assert final["c64-lookahead-1000000000"]["status"] == "skipped"
    assert final["c64-lookahead-1000000000"]["reason"].startswith("host memory")
    assert final["c64-lookahead-3"]["status"] == "ok" and final["c64-lookahead-3"]["kind"] == "max"
    assert "c64-lookahead-1000000000-drift2" not in final  # its variants need it
    assert final["c64-lookahead-2-drift4"]["status"] == "error" and "died" in final["c64-lookahead-2-drift4"]["error"]
    ok = {k for k, r in final.items() if r["status"] == "ok"}
    assert {
        "c64-dense-2",
        "c64-dense-3",
        "c64-dense-2-h200",
        "c64-dense-8",
        "c64-dense-8-unfused",
        "c64-lookahead-1",
        "c64-lookahead-2",
        "c64-lookahead-2-notransfer",
        "c64-lookahead-16",
        "c64-lookahead-16-unfused",
        "c64-lookahead-3-drift2",
        "c64-lookahead-1-fr0.1",
    } <= ok
    r = final["c64-lookahead-3-drift4"]
    assert r["synthetic_params"] == {"drift_rate": 0.48, "drift_zone": 0.48} and r["drift_rate"] == 0.48
    assert final["c64-lookahead-1-fr0.1"]["fetch_ratio"] == 0.1
    assert final["c64-dense-8-unfused"]["fused_ops"] is False and final["c64-dense-2-h200"]["kv_budget_gb"] == 120
    assert final["c64-lookahead-2-notransfer"]["no_transfer"] is True
    assert all("mem_available_gb" in final[k] for k in ok)

    n_lines = len(recs)
    assert H.main(args) == 0  # resume: every label with a result, and the lost alternatives of a won group, skipped
    assert len(_lines(out)) == n_lines

    rep_dir = tmp_path / "rep"
    tp = tmp_path / "tp.jsonl"
    tp.write_text(json.dumps(dict(final["c64-lookahead-2"], label="tp-uva-2")) + "\n")
    assert R.main(["--sweep", str(out), "--out-dir", str(rep_dir), "--transfer-paths", str(tp)]) == 0
    md = (rep_dir / "headline.md").read_text()
    assert (rep_dir / "headline.png").stat().st_size > 10_000
    for section in (
        "## Best against best at 52 GB",
        "## Curves",
        "## Sensitivity at 64",
        "## Overlap (item 2)",
        "## Dense against vLLM 0.26 and the HBM roofline",
        "## Where host memory bound lookahead",
        "## Kernel fusion A/B",
        "## Runs that did not complete",
        "## Transfer-path records",
    ):
        assert section in md, section
    assert "| 16K | 16 | not run | not run | not run |" in md  # item 2 at 16K: no record here -> "not run"
    assert "| 64 | 2 |" in md  # the overlap pair that ran
    assert "1000000000" in md and "host memory" in md  # where host memory bound
    assert "tp-uva-2" in md and "died" in md


def test_first_sensitivity_preset_keeps_the_2026_11_30_plan(tmp_path, capsys):
    H = _load("h200_headline")
    assert (
        H.main(
            [
                "--preset",
                "first-sensitivity",
                "--out",
                str(tmp_path / "s.jsonl"),
                "--dry-run",
                "--device",
                "cpu",
                "--model",
                "tiny",
                "--contexts",
                "64",
                "--la-n",
                "2,1",
                "--dense-n",
                "2",
            ]
        )
        == 0
    )
    plan = [
        ln.split("plan ", 1)[1].split()[0]
        for ln in capsys.readouterr().out.splitlines()
        if "] plan " in ln and "(first-sensitivity" not in ln
    ]
    assert plan == [
        "lookahead-2-base",
        "lookahead-2-drift2",
        "lookahead-2-drift4",
        "lookahead-2-fr0.02",
        "lookahead-2-fr0.1",
        "dense-2",
        "lookahead-1-base",
        "lookahead-1-drift2",
        "lookahead-1-drift4",
        "lookahead-1-fr0.02",
        "lookahead-1-fr0.1",
    ]


def test_poisoned_cuda_context_stops_the_process_and_the_next_resumes(tmp_path, monkeypatch):
    H = _load("h200_headline")
    import oasis_exec.tools.bench as B

    real, calls = B.run_bench, []

    def flaky(cfg, ctx, n, steps, warmup, host_fill=True):
        calls.append(n)
        if n == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(cfg, ctx, n, steps, warmup, host_fill)

    monkeypatch.setattr(B, "run_bench", flaky)
    out = tmp_path / "s.jsonl"
    args = [
        "--out",
        str(out),
        "--device",
        "cpu",
        "--model",
        "tiny",
        "--contexts",
        "64",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--dense-n",
        "1,2,3",
        "--anchors",
        "none",
        "--la-n",
        "none",
        "--max-n",
        "none",
        "--nt-n",
        "none",
        "--sens-n",
        "none",
    ]
    assert H.main(args) == 3 and calls == [1, 2]  # stopped after the poisoning error, dense-3 not tried
    assert H.main(args) == 0 and calls == [1, 2, 3]  # resumed in a "fresh process": the error is not retried
    final = {r["label"]: r["status"] for r in _lines(out) if r["status"] != "started"}
    assert final == {"c64-dense-1": "ok", "c64-dense-2": "error", "c64-dense-3": "ok"}


def test_mode_variant_plans_another_sparse_mode_at_the_same_point(tmp_path, capsys):
    H = _load("h200_headline")
    assert H.variant_params("mode=hisparse", 0.1, 0.1)[2] == {"mode": "hisparse"}
    with pytest.raises(ValueError, match="nosuch"):
        H.variant_params("mode=nosuch", 0.1, 0.1)
    argv = ["--out", str(tmp_path / "p.jsonl"), "--dry-run", "--contexts", "16k", "--dense-n", "none"]
    argv += ["--la-n", "44", "--max-n", "none", "--nt-n", "none", "--sens-n", "44", "--variants", "mode=hisparse"]
    assert H.main(argv + ["--anchors", "none", "--assume-mem-gb", "262"]) == 0
    plan = [ln.split("plan ", 1)[1].split()[0] for ln in capsys.readouterr().out.splitlines() if "] plan " in ln]
    assert plan[1:] == ["16k-lookahead-44", "16k-hisparse-44"]  # after the "(headline)" line


def test_a_variant_may_set_the_transfer_path(tmp_path):
    """``set=transfer:...`` (with its programs) overrides the sweep's own ``--transfer``, not a duplicate keyword."""
    H = _load("h200_headline")
    out = tmp_path / "t.jsonl"
    argv = ["--out", str(out), "--device", "cpu", "--model", "tiny", "--contexts", "64", "--steps", "2", "--warmup"]
    argv += ["1", "--dense-n", "none", "--anchors", "none", "--la-n", "2", "--max-n", "none", "--nt-n", "none"]
    argv += ["--sens-n", "2", "--variants", "set=transfer:uva+uva_programs:4", "--assume-mem-gb", "262", *FREE]
    assert H.main(argv) == 0
    done = {r["label"]: r for r in _lines(out) if r.get("status") == "ok"}
    assert set(done) == {"c64-lookahead-2", "c64-lookahead-2-set=transfer:uva+uva_programs:4"}
    assert done["c64-lookahead-2-set=transfer:uva+uva_programs:4"]["uva_programs"] == 4


def test_an_fp8_host_copy_sizes_the_pool_in_its_own_bytes(tmp_path, capsys):
    """--exec host_kv_dtype=fp8_e4m3: the plan's pools (and the runs' host_kv_gb) count a byte an element plus the
    scales, so 88 fp8 requests of 16K plan the pool 44 bf16 ones do; a variant may not change the pool's dtype."""
    H = _load("h200_headline")
    g16, g8 = H.Geometry("qwen3-8b", "cuda", 24, 4), H.Geometry("qwen3-8b", "cuda", 24, 4, host_kv_dtype="fp8_e4m3")
    assert g16.unit == 36 * 8 * 16 * 128 * 2 * 2 and g8.unit == 36 * 8 * 2 * (16 * 128 + 4)
    assert abs(g8.host_gb(88, 16384) - g16.host_gb(44, 16384)) < 0.5
    argv = ["--out", str(tmp_path / "p.jsonl"), "--dry-run", "--contexts", "16k", "--dense-n", "none", "--la-n", "88"]
    argv += ["--max-n", "none", "--nt-n", "none", "--sens-n", "none", "--anchors", "none", "--assume-mem-gb", "130"]
    assert H.main(argv + ["--exec", "host_kv_dtype=fp8_e4m3"]) == 0
    assert "host pool 1.228 GB a request" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="give it as --exec"):
        H.main(argv + ["--sens-n", "88", "--variants", "set=host_kv_dtype:fp8_e4m3"])


def test_repeat_runs_the_plan_again_and_pairs_twins_within_a_pass(tmp_path, capsys):
    """--repeat 2: the lookahead run, its twin and a variant again as ``-r2``, each record saying its pass; the
    baselines table pairs each run with its own pass's twin of the same fetch cap; the default model-selected work is
    recorded."""
    H, T = _load("h200_headline"), _load("baselines_table")
    out = tmp_path / "r.jsonl"
    argv = ["--out", str(out), "--device", "cpu", "--model", "tiny", "--contexts", "64", "--steps", "2", "--warmup"]
    argv += ["1", "--dense-n", "none", "--anchors", "none", "--la-n", "2", "--max-n", "none", "--nt-n", "2"]
    argv += ["--sens-n", "2", "--variants", "fr0.1", "--assume-mem-gb", "262", *FREE, "--repeat", "2"]
    assert H.main(argv) == 0
    done = {r["label"]: r for r in _lines(out) if r.get("status") == "ok"}
    first = ["c64-lookahead-2", "c64-lookahead-2-notransfer", "c64-lookahead-2-fr0.1"]
    assert set(done) == set(first) | {f"{x}-r2" for x in first}
    assert {done[x]["repeat"] for x in first} == {1} and {done[f"{x}-r2"]["repeat"] for x in first} == {2}
    assert all(r["synthetic_ahead"] > 0 and r["synthetic_topk"] for r in done.values())
    capsys.readouterr()
    T.main(str(tmp_path))
    rows = [ln.split("|") for ln in capsys.readouterr().out.splitlines() if ln.startswith("| OasisKV lookahead, ")]
    # both passes' lookahead runs at fetch 0.05 over the twin of their own pass; the fetch 0.1 runs have no twin of
    # their own cap (a twin shares the run's cap), so no ratio
    tps = {round(r["throughput_tok_s"], 1): r for r in done.values()}
    ratios = 0
    for row in rows:
        r = tps[float(row[8])]
        twin = done["c64-lookahead-2-notransfer" + ("-r2" if r["repeat"] == 2 else "")]
        same_cap = r["fetch_ratio"] == twin["fetch_ratio"]
        assert row[13].strip() == (f"{r['tpot_ms_p50'] / twin['tpot_ms_p50']:.3f}" if same_cap else "")
        ratios += same_cap
    assert len(rows) == 4 and ratios == 2
    with pytest.raises(SystemExit, match="repeat"):
        H.main(argv[:-1] + ["0"])
