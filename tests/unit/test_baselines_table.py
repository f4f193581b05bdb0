"""experiments/dense_vs_lookahead_throughput/baselines_table.py: ratios against the same call's best vLLM, and each
sparse run's no-transfer twin of the same side-stream priority (not the last twin of its point)."""

import json

from experiment_scripts import load_script

bt = load_script("dense_vs_lookahead_throughput/baselines_table.py")


def _run(tpot, prio, nt=False):
    return dict(mode="lookahead", context=16384, concurrency=44, throughput_tok_s=44e3 / tpot, tpot_ms_p50=tpot,
                no_transfer=nt, stream_priority=prio, decode_chain=8, selection="synthetic", status="ok")  # fmt: skip


def test_twins_match_priority_and_ratio_uses_best_vllm(tmp_path, capsys):
    with open(tmp_path / "vllm_16384.json", "w") as fh:
        json.dump({"ctx": 16384, "runs": [{"conc": 16, "decode_tok_s": 1000.0, "tpot_ms": 14.0},
                                          {"conc": 21, "decode_tok_s": 900.0, "tpot_ms": 20.0}]}, fh)  # fmt: skip
    rows = [_run(17.0, "normal"), _run(14.0, "normal", True), _run(18.0, "pred_low"), _run(12.0, "pred_low", True)]
    (tmp_path / "oasis.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bt.main(str(tmp_path))
    out = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| OasisKV")]
    assert len(out) == 4
    assert out[0].endswith(f"| {17 / 14:.3f} |") and f"| {44e3 / 17 / 1000:.2f} |" in out[0]
    assert "streams pred_low" in out[2] and out[2].endswith("| 1.500 |")
    assert "streams" not in out[0]
