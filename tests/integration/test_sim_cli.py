"""The command line: outputs, determinism, and every malformed input -> exit 2 with one line."""

import json
import os
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_cases import QUICK, _req, _trace

from oasis_sim.cli import main
from oasis_sim.workloads import BUNDLED_NAME, bundled_trace_path


def test_run_writes_every_output(tmp_path):
    out = tmp_path / "o"
    assert main(["run", "--out", str(out), *QUICK]) == 0
    for name in ("summary.json", "requests.csv", "timeline.json", "steps.csv", "memory.csv", "timing.json"):
        assert (out / name).is_file(), name
    s = json.loads((out / "summary.json").read_text())
    for key in (
        "throughput_tok_s",
        "tpot_ms_p50",
        "tpot_ms_p99",
        "ttft_ms_p50",
        "ttft_ms_p99",
        "requests_completed",
        "preemptions",
        "h2d_bytes",
        "net_bytes",
        "hbm_peak_bytes",
        "host_peak_bytes",
        "resident_recall",
        "stall_ms_total",
        "simulated_s",
    ):
        assert key in s, key
    assert s["requests_completed"] == 3
    assert "wall_s" in json.loads((out / "timing.json").read_text())
    tl = json.loads((out / "timeline.json").read_text())
    assert any(e.get("ph") == "X" and e["tid"] == 1 for e in tl["traceEvents"])
    assert (out / "requests.csv").read_text().count("\n") == 4


def test_same_inputs_and_seed_give_byte_identical_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        assert main(["run", "--out", str(d), "--seed", "5", "--mode", "lookahead", *QUICK]) == 0
    for name in ("summary.json", "requests.csv", "steps.csv", "timeline.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_table_is_printed(capsys, tmp_path):
    assert main(["run", "--out", str(tmp_path), *QUICK[:-1]]) == 0
    out = capsys.readouterr().out
    assert "throughput" in out and "TPOT p50 / p99" in out and "x real time" in out


def test_module_entry_point_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "oasis_sim", "run", "--mode", "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_bundled_trace_copy_matches_the_repository():
    path = bundled_trace_path()
    assert path.is_file()
    pkg = os.path.join(os.path.dirname(__import__("oasis_sim").__file__), "data", BUNDLED_NAME)
    assert open(pkg, "rb").read() == open(path, "rb").read()


def test_import_and_sweep(tmp_path):
    src = tmp_path / "m.jsonl"
    src.write_text(
        '{"timestamp": 0, "input_length": 900, "output_length": 3, "hash_ids": [0, 1]}\n'
        '{"timestamp": 3000, "input_length": 700, "output_length": 2, "hash_ids": [0, 5]}\n'
    )
    out = tmp_path / "tr.json"
    assert main(["import", "mooncake", str(src), "-o", str(out), "--max-context", "800"]) == 0
    grid = tmp_path / "g.yaml"
    grid.write_text(
        f"trace: {out}\nbase: {{top_k: 16, policy_layers: 1, profile_steps: 4, timeline_steps: 0}}\n"
        "grid:\n  mode: [dense, lookahead]\nworkers: 1\n"
    )
    assert main(["sweep", str(grid), "--out", str(tmp_path / "sw")]) == 0
    import pandas as pd

    df = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert list(df["param.mode"]) == ["dense", "lookahead"] and (df["requests_completed"] == 2).all()


# -- errors: exit 2, one line naming file / record / field / value ----------------------------------------------
def _bad_traces(tmp_path):
    p = lambda name, text: ((tmp_path / name).write_text(text), str(tmp_path / name))[1]  # noqa: E731
    raw = tmp_path / "bin.json"
    raw.write_bytes(b"\xff\xfe{")
    return [
        (
            _trace(tmp_path, [{"id": 0, "arrival_s": 0, "prompt_tokens": 5}], "a.json"),
            ["a.json", "requests[0].output_tokens", "missing"],
        ),
        (
            _trace(tmp_path, [{**_req(), "prompt_tokens": "12"}], "b.json"),
            ["b.json", "requests[0].prompt_tokens", '"12"'],
        ),
        (_trace(tmp_path, [_req(prompt=-3)], "c.json"), ["requests[0].prompt_tokens", "-3"]),
        (_trace(tmp_path, [_req(out=0)], "d.json"), ["requests[0].output_tokens", "got 0"]),
        (_trace(tmp_path, [_req(0, 5.0), _req(1, 2.0)], "e.json"), ["requests[1].arrival_s", "2.0"]),
        (p("f.json", '{"schema": "oasiskv-trace", "version": 1, "requests": [{"id": 0'), ["f.json", "invalid JSON"]),
        (p("g.json", ""), ["g.json", "empty"]),
        (str(tmp_path / "missing.json"), ["missing.json", "cannot read"]),
        (str(tmp_path), [str(tmp_path), "directory"]),
        (p("h.json", "[1, 2]"), ["h.json", "top level"]),
        (_trace(tmp_path, [_req()], "i.json", schema="other"), ["i.json", "schema", "other"]),
        (_trace(tmp_path, [_req(0), _req(0, 1.0)], "j.json"), ["requests[1].id", "0"]),
        (str(raw), ["bin.json", "UTF-8"]),
        (
            p(
                "k.json",
                '{"schema": "oasiskv-trace", "version": 1, "requests": [{"id": 0, "arrival_s": NaN, '
                '"prompt_tokens": 5, "output_tokens": 1}]}',
            ),
            ["k.json", "NaN"],
        ),
        (_trace(tmp_path, [], "l.json"), ["l.json", "requests", "got 0"]),
    ]


def _check_one_line(capsys, argv, needles):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (argv, err)
    assert err.count("\n") == 1 and err.startswith("oasis-sim: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)


def test_malformed_traces_exit_2_with_one_line(tmp_path, capsys):
    cases = _bad_traces(tmp_path)
    assert len(cases) >= 15
    for path, needles in cases:
        _check_one_line(capsys, ["run", path, "--out", str(tmp_path / "o"), "--quiet"], needles)


def test_bad_options_and_configs_exit_2_with_one_line(tmp_path, capsys):
    good = _trace(tmp_path, [_req()])
    cfg = lambda name, text: ((tmp_path / name).write_text(text), str(tmp_path / name))[1]  # noqa: E731
    cases = [
        (["--model", "gpt-9"], ["--model", "'gpt-9'", "qwen3-8b"]),
        (["--hardware", "tpu"], ["--hardware", "'tpu'"]),
        (["--mode", "sparse"], ["--mode", "'sparse'", "lookahead"]),
        (["--top-k", "0"], ["--top-k", "got 0"]),
        (["--top-k", "abc"], ["--top-k", "'abc'"]),
        (["--fetch-ratio", "1.5"], ["--fetch-ratio", "1.5"]),
        (["--fetch-ratio", "nan"], ["--fetch-ratio", "nan"]),
        (["--concurrency", "0"], ["--concurrency", "got 0"]),
        (["--arrival", "poisson"], ["--rate-rps", "None"]),
        (["--selection", "replay"], ["--replay-file"]),
        (["--syn-drift-rate", "2"], ["--syn-drift-rate", "2.0"]),
        (["--split", "rpf", "--mode", "dense"], ["--split", "dense"]),
        (["--nic", "carrier-pigeon"], ["--nic", "carrier-pigeon"]),
        (["--config", cfg("u.yaml", "mode: lookahead\nwarp: 9\n")], ["u.yaml", "warp", "unknown"]),
        (["--config", cfg("v.yaml", "mode: fast\n")], ["v.yaml", "mode", "'fast'"]),
        (["--config", cfg("w.yaml", "mode: [unclosed\n")], ["w.yaml", "invalid YAML", "line"]),
        (["--config", cfg("x.yaml", "")], ["x.yaml", "empty"]),
        (["--config", str(tmp_path / "nope.yaml")], ["nope.yaml", "cannot read"]),
        (["--config", cfg("y.yaml", "- 1\n- 2\n")], ["y.yaml", "top level"]),
        (["--selection", "replay", "--replay-file", cfg("z.json", "{}")], ["z.json", "initial"]),
        (["--no-such-option"], ["--no-such-option"]),
    ]
    assert len(cases) >= 20
    for extra, needles in cases:
        _check_one_line(capsys, ["run", good, "--out", str(tmp_path / "o"), "--quiet", *extra], needles)


def test_bad_import_and_sweep_inputs_exit_2(tmp_path, capsys):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 0, "input_length": -4, "output_length": 3, "hash_ids": [0]}\n')
    _check_one_line(
        capsys,
        ["import", "mooncake", str(src), "-o", str(tmp_path / "o.json")],
        ["m.jsonl", "line 1", "input_length", "-4"],
    )
    _check_one_line(
        capsys,
        ["import", "azure", str(tmp_path / "none.csv"), "-o", str(tmp_path / "o.json")],
        ["none.csv", "cannot read"],
    )
    _check_one_line(capsys, ["import", "mooncake", str(src), "-o", "x", "--time-scale", "0"], ["time_scale", "0"])
    grid = tmp_path / "g.yaml"
    grid.write_text("grid:\n  mode: [dense, quantum]\n")
    _check_one_line(capsys, ["sweep", str(grid), "--out", str(tmp_path)], ["g.yaml", "point 1", "mode", "'quantum'"])
    grid.write_text("base: {mode: dense}\n")
    _check_one_line(capsys, ["sweep", str(grid), "--out", str(tmp_path)], ["g.yaml", "grid"])


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["id", "arrival_s", "prompt_tokens", "output_tokens", "prefix_block_ids", "prefix_block_tokens", "x"]
            ),
            c,
            max_size=6,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.one_of(
        st.binary(max_size=60),
        st.builds(
            lambda reqs: json.dumps({"schema": "oasiskv-trace", "version": 1, "requests": reqs}).encode(),
            st.lists(_json, max_size=3),
        ),
        st.builds(
            lambda reqs, cut: json.dumps({"schema": "oasiskv-trace", "version": 1, "requests": reqs})[:cut].encode(),
            st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.integers(0, 3),
                        "arrival_s": st.floats(0, 5),
                        "prompt_tokens": st.integers(-1, 3000),
                        "output_tokens": st.integers(-1, 5),
                    }
                ),
                min_size=1,
                max_size=2,
            ),
            st.integers(0, 400),
        ),
    )
)
def test_fuzz_loader_path_never_crashes(tmp_path, capsys, data):
    path = tmp_path / "fuzz.json"
    path.write_bytes(data)
    rc = main(
        [
            "run",
            str(path),
            "--out",
            str(tmp_path / "o"),
            "--mode",
            "dense",
            "--max-context",
            "64",
            "--timeline-steps",
            "0",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err
    assert rc in (0, 2)
    if rc == 2:
        assert err.count("\n") == 1 and "fuzz.json" in err


def test_summary_and_sweep_record_the_configuration_and_trace(tmp_path):
    import hashlib

    import pandas as pd

    from oasis_sim.config import config_fields

    trace = _trace(tmp_path, [_req(0), _req(1, 0.5)])
    digest = hashlib.sha256(open(trace, "rb").read()).hexdigest()
    out = tmp_path / "o"
    assert (
        main(
            [
                "run",
                trace,
                "--out",
                str(out),
                *QUICK,
                "--top-k",
                "24",
                "--fetch-ratio",
                "0.2",
                "--block-size",
                "32",
                "--seed",
                "7",
            ]
        )
        == 0
    )
    s = json.loads((out / "summary.json").read_text())
    assert set(s["config"]) == set(config_fields())
    assert (s["config"]["top_k"], s["config"]["fetch_ratio"], s["config"]["block_size"], s["config"]["seed"]) == (
        24,
        0.2,
        32,
        7,
    )
    assert s["trace"] == {"path": trace, "sha256": digest}
    grid = tmp_path / "g.yaml"
    grid.write_text(
        f"trace: {trace}\nbase: {{top_k: 16, policy_layers: 1, profile_steps: 4, timeline_steps: 0}}\n"
        "grid:\n  seed: [1, 2]\nworkers: 1\n"
    )
    assert main(["sweep", str(grid), "--out", str(tmp_path / "sw")]) == 0
    df = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert {f"config.{k}" for k in config_fields()} <= set(df.columns)
    assert list(df["config.seed"]) == [1, 2] and (df["config.top_k"] == 16).all()
    assert (df["trace.sha256"] == digest).all() and (df["trace.path"] == trace).all()
