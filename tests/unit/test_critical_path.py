"""experiments/decode_step_profile/critical_path.py on a hand-made trace: one graph replay, a main stream with a gap
that a side-stream kernel releases, a copy beside main, and a tail of side work after main's last kernel."""

import gzip
import json
import os
import sys

from experiment_scripts import load_script

_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments", "decode_step_profile"
)
sys.path.insert(0, _DIR)
cp = load_script("decode_step_profile/critical_path.py")


def _k(name, stream, ts, dur, corr=7):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "correlation": corr},
    }


def _trace(tmp_path):
    ev = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5, "args": {"correlation": 7}},
        _k("nvjet_sm90_gemm", 1, 10, 40),  # main 10..50
        _k("block_score_kernel", 2, 20, 20),  # side 20..40
        _k("plan_select_kernel", 2, 40, 30),  # side 40..70: main waits 50..70 for it
        _k("sparse_attn_kernel", 1, 70, 20),  # main 70..90
        _k("uva_gather_kernel", 3, 75, 40),  # copy 75..115, beside main 75..90
        _k("nvjet_sm90_gemm", 1, 91, 9),  # a 1 us gap (small), main ends at 100
        _k("other_kernel", 9, 120, 5, corr=8),  # not in a graph: between the two
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 90, "dur": 5, "args": {"correlation": 9}},
        _k("nvjet_sm90_gemm", 1, 130, 10, corr=9),  # the second graph
    ]
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as fh:
        json.dump({"traceEvents": ev}, fh)
    return str(p)


def test_gaps_tail_and_copy_overlap(tmp_path):
    rec = cp.analyse(_trace(tmp_path))
    s, s2 = rec["steps"]
    assert s["to_next_graph"] == {
        "gap_ms": 0.015,  # 115 .. 130
        "eager_kernels": 1,
        "eager_busy_ms": 0.005,
        "eager_top": {"other_kernel": 0.005},
    }
    assert "to_next_graph" not in s2 and s2["kernels"] == 1
    assert s["main_stream"] == 1 and s["kernels"] == 6
    assert s["span_ms"] == 0.105  # 10 .. 115
    assert s["main_busy_ms"] == 0.069  # 40 + 20 + 9
    assert s["head_ms"] == 0.0 and s["tail_ms"] == 0.015  # the copy runs to 115
    assert s["tail_kernels"] == ["uva_gather_kernel"]
    assert s["inner_gap_ms"] == 0.021 and s["small_gaps_ms"] == 0.001
    assert s["gaps_charged"] == {"plan_select_kernel": {"n": 1, "ms": 0.02}}
    assert s["main_with_copy_ms"] == 0.024  # 75 .. 90 and 91 .. 100
    assert s["layer_period_us"] is None and s["first_gemm_us"] == 0.0  # one attention kernel; the GEMM opens the span


def test_report_prints(tmp_path, capsys):
    assert cp.main([_trace(tmp_path), "--out", str(tmp_path / "o.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "plan_select_kernel" in out and "tail 0.015" in out and "to the next graph: 0.015 ms, 1 kernels" in out
    assert json.loads((tmp_path / "o.jsonl").read_text())["steps"][0]["main_busy_ms"] == 0.069
