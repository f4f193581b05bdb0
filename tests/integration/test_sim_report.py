"""Issue 35, newcomer items: an overloaded simulation says so at the end of its table; ``compare`` puts two runs
side by side."""

import json

from oasis_sim.cli import main
from oasis_sim.report import compare_table, overload_note

QUICK = ["--mode", "dense", "--max-requests", "100", "--policy-layers", "1", "--timeline-steps", "0"]


def _rows(waits):
    return [
        {"arrival_s": float(i), "admit_s": i + w, "finish_s": i + w + 1.0, "ttft_ms": (w + 0.1) * 1e3}
        for i, w in enumerate(waits)
    ]


def test_overload_note_rule():
    assert overload_note(_rows([0.1] * 40)) is None  # a steady queue
    assert overload_note(_rows([0.1] * 10)) is None
    note = overload_note(_rows([0.1 * i for i in range(40)]))  # waits grow 0.1 s a request: medians 0.45, 3.45 s
    assert note.startswith("overloaded: the queue grows (requests wait 0.5 s to start early in the trace, 3.4 s late")
    assert overload_note(_rows([0.01 * i for i in range(40)])) is None  # 0.04 -> 0.34 s: under MIN_GROWTH_S
    never = _rows([0.1] * 30) + [{"arrival_s": 30.0 + i, "admit_s": None, "ttft_ms": None} for i in range(10)]
    assert overload_note(never) is not None  # requests never admitted waited to the end
    assert overload_note(_rows([0.1] * 4)) is None  # too few requests to tell


def test_an_overloaded_run_says_so_and_a_light_one_does_not(tmp_path, capsys):
    assert main(["run", *QUICK, "--time-scale", "0.05", "--out", str(tmp_path / "heavy")]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[-2].startswith("overloaded: the queue grows") and lines[-1].startswith("wrote"), out
    assert main(["run", *QUICK, "--time-scale", "20", "--out", str(tmp_path / "light")]) == 0
    assert "overloaded: the queue" not in capsys.readouterr().out
    assert main(["run", *QUICK, "--time-scale", "0.05", "--quiet", "--out", str(tmp_path / "h2")]) == 0
    assert capsys.readouterr().err.startswith("oasis-sim: overloaded:")


def test_compare_two_runs(tmp_path, capsys):
    for mode in ("dense", "lookahead"):
        args = ["run", *QUICK, "--mode", mode, "--max-requests", "8", "--quiet", "--out", str(tmp_path / mode)]
        assert main(args) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "dense"), str(tmp_path / "lookahead")]) == 0
    out = capsys.readouterr().out.splitlines()
    a = json.loads((tmp_path / "dense" / "summary.json").read_text())
    b = json.loads((tmp_path / "lookahead" / "summary.json").read_text())
    assert out[0].split() == ["dense", "lookahead", "lookahead", "/", "dense"]
    thr = next(line for line in out if line.startswith("throughput"))
    assert thr.endswith(f"{b['throughput_tok_s'] / a['throughput_tok_s']:.2f}x"), thr
    assert f"{a['throughput_tok_s']:,.1f} tok/s" in thr
    assert compare_table(a, b).splitlines()[0].split() == ["A", "B", "B", "/", "A"]


def test_compare_refuses_what_is_not_a_run(tmp_path, capsys):
    (tmp_path / "x.json").write_text("[1, 2]")
    for bad in (str(tmp_path / "x.json"), str(tmp_path / "nope")):
        assert main(["compare", bad, bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and bad.split("/")[-1] in err, err
