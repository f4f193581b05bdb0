"""`serve --record FILE`: the served requests as a `trace` recording, and its replay in the simulator."""

import signal

import httpx
import pytest

from oasis_core.recording import load_recording
from oasis_exec.server.recording import recording_from_serve, write_serve_recording
from oasis_sim.replay import replay, sim_config, workload

CFG = {
    "model": "tiny",
    "mode": "lookahead",
    "top_k": 4,
    "block_size": 16,
    "fetch_ratio": 0.05,
    "seed": 0,
    "transfer": "host",
    "prefill_chunk": 2048,
    "model_path": None,
}


def _req(i, arrival, prompt, n, reason="length", ttft=5.0, step=2.0):
    return {
        "id": i,
        "arrival_s": arrival,
        "prompt_tokens": prompt,
        "output_tokens": n,
        "finish_reason": reason,
        "ttft_ms": ttft if n else None,
        "tpot_ms": step if n > 1 else None,
        "finish_s": arrival + (ttft + step * max(n - 1, 0)) / 1e3,
    }


SERVE = {
    "requests": [
        _req(1, 0.30, 64, 8, step=3.0),
        _req(0, 0.10, 40, 6),
        _req(2, 0.35, 50, 0, "abort"),
        _req(3, 0.40, 48, 3, "abort", ttft=9.0),
    ],
    "step_ms": [4.0] * 20,
    "max_running": 2,
    "max_lanes": 2,
    "decode_steps": 16,
    "prefetch_bytes": 3200,
    "stage_ms": {},
    "hidden_fraction": float("nan"),
    "device": "cpu",
    "date": "2026-12-01T00:00:00+00:00",
    "commit": "abc",
    "server": {"max_waiting": 8},
}


def test_recording_from_serve_keeps_requests_with_tokens(tmp_path):
    path = str(tmp_path / "s.json")
    write_serve_recording(path, SERVE, CFG, hardware="h200")
    rec = load_recording(path)
    c, r = rec.config, rec.results
    assert c["workload"] == "trace" and c["hardware"] == "h200" and c["transfer_path"] == "dma"
    assert (c["context"], c["concurrency"], c["max_lanes"], c["steps"], c["warmup_steps"]) == (64, 2, 2, 20, 0)
    assert c["exec_config"]["top_k"] == 4 and c["server"] == {"max_waiting": 8}
    # in arrival order; the request aborted before its first token is dropped, the one aborted later kept
    assert [(q.id, q.prompt_tokens, q.output_tokens) for q in rec.trace.requests] == [
        (0, 40, 6),
        (1, 64, 8),
        (3, 48, 3),
    ]
    assert r["request_finish_reasons"] == ["length", "length", "abort"] and r["requests_dropped"] == {"abort": 1}
    assert r["ttft_ms_p50"] == pytest.approx(5.0) and r["tpot_ms_p50"] == pytest.approx(2.0)
    assert r["tpot_ms_p99"] == pytest.approx(2.98)  # linear interpolation over [2, 2, 3], as oasis_sim.metrics
    span = max(q["finish_s"] for q in SERVE["requests"] if q["output_tokens"]) - 0.10
    assert r["throughput_tok_s"] == pytest.approx(17 / span)
    assert r["bytes_per_step"] == {"pcie_h2d": 200.0} and r["link_bytes"] == {"pcie_h2d": 3200}
    assert r["hidden_fraction"] is None and r["stall_ms_per_step"] is None
    with pytest.raises(ValueError, match="cannot tell the preset from device 'cpu'"):
        recording_from_serve(SERVE, CFG)
    with pytest.raises(ValueError, match="no served request produced a token"):
        recording_from_serve(dict(SERVE, requests=[_req(0, 0.1, 40, 0, "error")]), CFG, hardware="h200")


def test_replay_runs_a_trace_recording_open_loop():
    rec = recording_from_serve(SERVE, CFG, hardware="h200")
    cfg = sim_config(rec)
    assert cfg.arrival == "trace" and cfg.concurrency is None and cfg.max_batch == 2 and cfg.chunk_tokens == 2048
    assert [q.arrival_s for q in workload(rec).requests] == [0.1, 0.3, 0.4]
    res = replay(rec)
    assert res.sim.summary["requests_completed"] == 3
    assert res.predicted["tpot_ms_p50"] == res.sim.summary["tpot_ms_p50"] > 0
    assert res.predicted["throughput_tok_s"] == res.sim.summary["throughput_tok_s"] > 0
    assert res.predicted["ttft_ms_p50"] > 0 and res.window
    assert "exec_timeline.json" in res.files()


def test_real_server_records_what_it_served(tmp_path):
    pytest.importorskip("torch")
    from server_proc import TINY, ServerProcess

    path = tmp_path / "served.json"
    srv = ServerProcess(
        *TINY,
        "--dtype",
        "float32",
        "--top-k",
        "4",
        "--max-context",
        "256",
        "--host-kv-gb",
        "0.01",
        "--kv-budget-gb",
        "0.05",
        "--max-lanes",
        "2",
        "--record",
        str(path),
        "--record-hardware",
        "h200",
    )
    try:
        prompts = [[1 + i, 2, 3, 4, 5] * (6 + 2 * i) for i in range(3)]
        for p in prompts:
            r = httpx.post(
                f"{srv.base_url}/v1/completions", json={"model": "tiny", "prompt": p, "max_tokens": 5}, timeout=60
            )
            assert r.status_code == 200, r.text
        srv.proc.send_signal(signal.SIGINT)
        srv.proc.wait(60)
    finally:
        srv.stop()
    assert path.exists(), srv.logs()
    rec = load_recording(path)
    assert rec.config["workload"] == "trace" and rec.config["mode"] == "lookahead" and rec.config["top_k"] == 4
    assert [(q.prompt_tokens, q.output_tokens) for q in rec.trace.requests] == [(len(p), 5) for p in prompts]
    arr = [q.arrival_s for q in rec.trace.requests]
    assert arr == sorted(arr) and arr[0] >= 0
    r = rec.results
    assert r["request_finish_reasons"] == ["length"] * 3 and r["requests_dropped"] == {}
    assert r["tpot_ms_p99"] >= r["tpot_ms_p50"] > 0 and r["ttft_ms_p50"] > 0 and r["throughput_tok_s"] > 0
    assert r["device"] and r["date"] and r["commit"] and rec.config["steps"] >= 5
    res = replay(rec)
    assert res.sim.summary["requests_completed"] == 3 and res.predicted["tpot_ms_p50"] > 0
