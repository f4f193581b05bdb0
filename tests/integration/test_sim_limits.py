"""Runaway inputs are refused before the work, and extreme but valid ones keep their outputs meaningful."""

import json

import pytest
from sim_cases import QUICK, _req, _trace

from oasis_sim import limits, workloads
from oasis_sim.cli import main
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.workloads import bundled_trace_path, load_workload, make_requests


def test_footprint_grows_with_top_k_and_layers_and_refuses_the_absurd():
    trace = load_workload(None)
    small, _, _ = limits.policy_bytes(SimConfig(), [100, 400, 2000], 8)
    assert 0 < small < limits.limit_bytes()
    assert limits.policy_bytes(SimConfig(top_k=4096), [100, 400, 2000], 8)[0] > small
    assert limits.policy_bytes(SimConfig(policy_layers=8), [100, 400, 2000], 8)[0] == pytest.approx(4 * small)
    assert limits.policy_bytes(SimConfig(mode="dense"), [100], 8)[0] == 0
    make_requests(trace, SimConfig())  # the default run fits
    with pytest.raises(ConfigError, match=r"^top_k: 1,000,000,000 .* GiB limit"):
        make_requests(trace, SimConfig(top_k=10**9))
    with pytest.raises(ConfigError, match="policy_layers = 100000"):
        make_requests(trace, SimConfig(policy_layers=100_000))


@pytest.mark.parametrize("option", [["--rate-rps", "1e-300", "--arrival", "poisson"], ["--time-scale", "1e300"]])
def test_arrivals_beyond_float_precision_are_refused(tmp_path, capsys, option):
    assert main(["run", "--out", str(tmp_path), *QUICK, *option]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lose the 0.1 us precision" in err


def test_late_but_valid_arrivals_keep_their_ttft(tmp_path):
    trace = _trace(tmp_path, [_req(0, 0.0), _req(1, 1.0)])
    ttft = {}
    for scale in ("100", "5e7"):
        out = tmp_path / scale
        assert main(["run", trace, "--out", str(out), *QUICK, "--time-scale", scale]) == 0
        rows = (out / "requests.csv").read_text().splitlines()
        head = rows[0].split(",")
        ttft[scale] = float(rows[2].split(",")[head.index("ttft_ms")])
    assert ttft["100"] > 0 and ttft["5e7"] == pytest.approx(ttft["100"], abs=1e-3)


def test_a_recording_claiming_a_billion_steps_is_refused(tmp_path, capsys):
    src = bundled_trace_path().parent / "recordings" / "dense-8k-c8.json"
    obj = json.loads(src.read_text())
    obj["config"]["steps"] = 10**9
    bad = tmp_path / "huge.json"
    bad.write_text(json.dumps(obj))
    assert main(["replay", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.steps: must be <= 65536, got 1000000000" in err


def test_a_large_trace_reports_progress_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(workloads, "PROGRESS_BYTES", 1000)
    assert load_workload(None) == load_workload(str(bundled_trace_path()))
    assert "reading mooncake_slice.json" in capsys.readouterr().err
    monkeypatch.setattr(workloads, "PROGRESS_BYTES", 10**12)
    load_workload(None)
    assert capsys.readouterr().err == ""
