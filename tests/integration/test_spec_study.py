"""experiments/speculative_decoding: the study's table and phase values, and the replay of a speculative recording
with synthetic acceptance (tiny preset, CPU, a recording for the h200 preset) in the simulator: the simulated tokens
a step follow the recorded acceptance, and the what-if rows draw from the study's measured histograms."""

import json
import statistics

import pytest
from exec_cases import cfg
from experiment_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load(name):
    return load_script(f"speculative_decoding/{name}.py")


def _rec(k, run, tok_s, tokens, mode="dense", hist=None):
    return {
        "mode": mode, "context": 4096, "speculative_k": k, "run": run, "throughput_tok_s": tok_s,
        "accepted_tokens_per_step": tokens, "accepted_hist": hist, "tpot_ms_p50": 100.0 * tokens * 2 / tok_s * 10,
        "tpot_ms_mean": 2e3 * tokens / tok_s, "model": "m.gguf", "draft": "head", "selection": "model",
        "device": "cpu", "date": "2026-12-01T00:00:00", "commit": "abc", "prefill": "real (t)", "concurrency": 2,
        "top_k": 64, "steps": 12, "warmup": 3, "acceptance": "model" if k else None, "weights": "real",
    }  # fmt: skip


def test_table_compares_with_the_fresh_k0_run():
    s = _load("spec_study")
    assert s.phase_values(["0", "2", "auto"]) == [0, 2, "auto:2"] and s.phase_values(["auto:4"]) == ["auto:4"]
    recs = [_rec(0, "phase", 8.0, 1.0), _rec(0, "fresh", 10.0, 1.0), _rec(2, "phase", 15.0, 1.5, hist={"2": [1, 0, 1]})]
    md = s.table(recs)
    rows = {
        line.split("|")[4].strip() + line.split("|")[3].strip(): line for line in md.splitlines() if "| dense |" in line
    }
    assert "| 1.50× | 0.67× |" in rows["phase2"]  # 15 / 10 tok/s, TPOT (1.5 / 15 ... ) against the fresh run's
    assert "| 0.80× | 1.25× |" in rows["phase0"] and "| 1.00× | 1.00× |" in rows["fresh0"]
    assert "Weights: real" in md and "selection source: model" in md and "commit: abc" in md


def test_table_takes_the_chained_k0_run_as_baseline_and_shows_the_step_time():
    s = _load("spec_study")
    spec = dict(_rec(1, "phase", 12.0, 1.2, mode="lookahead", hist={"1": [4, 1]}), step_ms_p50=7.5, step_ms_mean=9.6)
    chained = dict(_rec(0, "chained", 10.0, 4.0, mode="lookahead"), step_ms_mean=32.0)  # a chain of 4: 8 ms a token
    recs = [
        _rec(0, "phase", 8.0, 1.0, mode="lookahead"),
        _rec(0, "fresh", 9.0, 1.0, mode="lookahead"),
        chained,
        spec,
    ]
    md = s.table(recs)
    rows = {
        line.split("|")[4].strip() + line.split("|")[3].strip(): line
        for line in md.splitlines()
        if "| lookahead |" in line
    }
    assert "| 1.20× |" in rows["phase1"]  # 12 / 10: against the chained k = 0, not the fresh (9) or the phase (8)
    assert "| 0.90× |" in rows["fresh0"] and "| 1.00× |" in rows["chained0"]
    # the step's p50 (not the per-token TPOT); TPOT 9.6 ms / 1.2 tokens a step = 8.0, the chain's 32 ms / 4 tokens
    assert "| 7.5 | 8.0 | 1.20× | 1.00× |" in rows["phase1"] and "| 8.0 | 1.00× | 1.00× |" in rows["chained0"]
    assert list(rows) == ["phase0", "fresh0", "chained0", "phase1"]


def test_replay_draws_the_recorded_acceptance_and_what_if_uses_the_study(tmp_path):
    from oasis_core.recording import load_recording
    from oasis_exec.tools.bench import run_bench
    from oasis_exec.tools.recorder import write_bench_recording

    r = _load("replay_spec")
    recs = []
    for k, acc in ((2, {"2": [0, 0, 5]}), (0, None)):
        c = cfg("lookahead", max_context=512, max_lanes=4, short_context=False, speculative_k=k, synthetic_accept=acc,
                selection="synthetic", synthetic={"preset": "smollm2"})  # fmt: skip
        rec = run_bench(c, context=200, concurrency=4, steps=4, warmup=1)
        path = tmp_path / f"k{k}.json"
        write_bench_recording(str(path), rec, c, hardware="h200")
        recs.append(load_recording(str(path)))
    assert recs[0].config["acceptance"] == "synthetic"
    rows = r.replay_rows(recs, None)
    assert rows[0]["tokens_per_step"]["measured"] == 3.0 and rows[0]["tokens_per_step"]["simulated"] == 3.0
    # the simulator's TPOT is the bench's: a step's time over the tokens it gave each request (3 here), not the step
    from oasis_sim.replay import replay

    res = replay(recs[0])
    step_ms = 1e3 * statistics.median(res.sim.steps.dur[i] for i in res.window)
    assert res.predicted["tpot_ms_p50"] == pytest.approx(step_ms / 3, rel=1e-9)
    assert rows[1]["tokens_per_step"]["simulated"] == 1.0 and rows[0]["acceptance"] == "synthetic"
    study = tmp_path / "study.jsonl"
    study.write_text(json.dumps({"mode": "lookahead", "context": 8, "speculative_k": 1, "accepted_hist": {"1": [0, 9]},
                                 "acceptance": "model"}) + "\n")  # fmt: skip
    w = r.what_if(recs, [], ["0", "1", "2"], r.study_hists(str(study), "lookahead"))
    assert [x["speculative_k"] for x in w] == [0, 1, 2] and "error" in w[2]  # no measured k = 2 acceptance
    assert w[0]["roofline"]["tokens_per_step"] == 1.0 and w[1]["roofline"]["tokens_per_step"] == 2.0  # always 1
    assert w[0]["executor"]["recording"] == "k0"
    md = r.markdown(rows, w, [], "study.jsonl")
    assert "| k2 | lookahead | 200 × 4 | 2 | synthetic | 3.00 / 3.00 |" in md


def test_draft_ngram_reaches_the_config():
    import argparse

    study = _load("spec_study")
    a = argparse.Namespace(model_path=None, draft_path=None, device="cpu", dtype="float32", top_k=4, concurrency=2)
    a.warmup, a.steps = 1, 1
    assert study.base_config(a, "lookahead", 256, 1).draft_ngram == 2  # the config's default
    a.draft_ngram = 0
    c = study.base_config(a, "lookahead", 256, 1)
    assert c.draft_ngram == 0 and c.speculative_k == 1 and c.spec_chain == 1
