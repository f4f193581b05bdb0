"""A bounded load test of the real server: 300 streamed requests from the Mooncake trace, 32 in flight, 10% of
clients hanging up mid-stream. Every request is accounted for and the pools are empty afterwards."""

from __future__ import annotations

import asyncio

import pytest
from experiment_scripts import load_script

pytest.importorskip("fastapi")

from server_proc import TINY, ServerProcess

N_REQUESTS, CONCURRENCY, DISCONNECT = 300, 32, 0.10


def _loadgen():
    return load_script("common/loadgen.py", "oasis_loadgen")


def test_bounded_load_with_disconnects():
    lg = _loadgen()
    srv = ServerProcess(
        *TINY, "--max-context", "512", "--dtype", "float32", "--max-waiting", "512", "--max-lanes", str(CONCURRENCY)
    )
    try:
        cfg = lg.LoadConfig(
            base_url=srv.base_url,
            limit=N_REQUESTS,
            time_scale=0.002,
            concurrency=CONCURRENCY,
            max_prompt=48,
            max_output=6,
            disconnect_frac=DISCONNECT,
            seed=1,
            timeout_s=60,
            per_request=True,
        )
        result = asyncio.run(lg.run_load(cfg))
        recs = result["per_request"]
        assert len(recs) == N_REQUESTS
        outcomes = result["outcomes"]
        assert set(outcomes) <= {"ok", "disconnected"}, result["errors"]
        n_drop = sum(1 for j in lg.make_jobs(cfg, 512, 256) if j.disconnect_after is not None)
        assert 0.05 * N_REQUESTS < n_drop < 0.15 * N_REQUESTS
        assert outcomes.get("disconnected", 0) <= n_drop
        ok = [r for r in recs if r["outcome"] == "ok"]
        assert all(r["finish_reason"] == "length" and r["ttft_s"] is not None for r in ok)
        m = srv.wait_idle()
        ended = {k: v for k, v in m.items() if k.startswith("oasis_requests_total{")}
        assert sum(ended.values()) == N_REQUESTS, ended  # the server ended every request exactly once
        assert set(ended) <= {'oasis_requests_total{outcome="length"}', 'oasis_requests_total{outcome="abort"}'}
        assert ended.get('oasis_requests_total{outcome="length"}', 0) >= len(ok)
        assert m["oasis_gpu_slots_used"] == 0 and m["oasis_host_blocks_used"] == 0
        assert m["oasis_engine_healthy"] == 1
        assert "Traceback" not in srv.logs()
    finally:
        srv.stop()
