"""No silent request loss in the simulator: every request ends completed or rejected with a reason, the summary
and stderr say so, and weights that cannot fit the GPU are an error before the run."""

import json

from oasis_sim.cli import main


def test_qwen3_32b_on_the_bundled_trace_ends_every_request(tmp_path, capsys):
    assert main(["run", "--model", "qwen3-32b", "--quiet", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["requests"] == 200 and s["requests_completed"] + s["requests_rejected"] == 200
    # prompts whose prefill staging exceeds the ~8 GB of HBM left next to the weights can never be admitted; they
    # used to block the FCFS queue (6 of 200 completed), now they end at once and the rest run
    assert s["requests_rejected"] == s["rejected_gpu_capacity"] > 0 and s["requests_completed"] > 100
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        f"oasis-sim: {s['requests_rejected']} of 200 requests rejected "
        f"({s['rejected_gpu_capacity']} gpu_capacity): they can never be admitted"
    )
    # the trace's arrivals outpace a 32B model on one GPU: the run says it was overloaded (issue 35)
    assert len(err) == 2 and err[1].startswith("oasis-sim: overloaded: the queue grows"), err


def test_a_run_without_rejections_says_nothing_on_stderr(tmp_path, capsys):
    assert main(["run", "--max-requests", "5", "--quiet", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert (s["requests_completed"], s["requests_rejected"]) == (5, 0)
    assert capsys.readouterr().err == ""


def test_weights_that_cannot_fit_are_an_error_before_the_run(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", "--model", "qwen3-235b-a22b", "--hardware", "h100-sxm", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "weights" in err[0] and "qwen3-235b-a22b" in err[0]
    assert not (out / "summary.json").exists()


def test_closed_loop_keeps_going_past_rejected_requests(tmp_path):
    assert (
        main(
            [
                "run",
                "--model",
                "qwen3-32b",
                "--concurrency",
                "4",
                "--max-requests",
                "60",
                "--quiet",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["requests_completed"] + s["requests_rejected"] == 60 and s["requests_rejected"] > 0
