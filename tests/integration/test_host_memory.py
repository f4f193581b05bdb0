"""The host KV pool: sized for the requests that run, checked against the host's available memory before pinning."""

from __future__ import annotations

import sys

import pytest

from oasis_exec.config import ExecConfig
from oasis_exec.kv import host_memory
from oasis_exec.kv.host_memory import HostMemoryError, check_fits, host_pool_blocks

GB = 1e9
TINY = {
    "model": "tiny",
    "device": "cpu",
    "dtype": "float32",
    "mode": "lookahead",
    "selection": "synthetic",
    "top_k": 4,
    "max_context": 256,
}


def test_pool_sizing_follows_host_kv_gb_then_host_requests_then_the_lanes():
    cfg = ExecConfig(**TINY)  # 16 blocks of 16 tokens a request
    assert host_pool_blocks(cfg, lanes=50, block_bytes=1000, available=10 * GB) == 50 * 16  # every lane
    assert (
        host_pool_blocks(ExecConfig(**TINY, host_requests=3), lanes=50, block_bytes=1000, available=10 * GB) == 3 * 16
    )
    assert (
        host_pool_blocks(ExecConfig(**TINY, host_requests=99), lanes=5, block_bytes=1000, available=10 * GB) == 5 * 16
    )  # never more requests than lanes
    assert (
        host_pool_blocks(
            ExecConfig(**TINY, host_kv_gb=0.01, host_requests=3), lanes=50, block_bytes=1000, available=10 * GB
        )
        == 10_000
    )


def test_a_pool_beyond_the_available_memory_is_refused_naming_both_sizes():
    check_fits(int(8.9 * GB), available=10 * GB)  # within POOL_SHARE
    with pytest.raises(HostMemoryError) as e:
        check_fits(int(78.4 * GB), available=61.2 * GB)
    msg = str(e.value)
    assert "78.4 GB" in msg and "61.2 GB available" in msg and "\n" not in msg
    with pytest.raises(HostMemoryError):
        host_pool_blocks(ExecConfig(**TINY, host_kv_gb=20.0), lanes=4, block_bytes=1000, available=10 * GB)


def test_available_memory_from_meminfo_without_psutil(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil -> ImportError
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   64000000 kB\n")
    monkeypatch.setattr(host_memory, "MEMINFO", str(info))
    assert host_memory.available_bytes() == 64000000 * 1024
    monkeypatch.setattr(host_memory, "MEMINFO", str(tmp_path / "absent"))
    assert host_memory.available_bytes() is None
    check_fits(10**15)  # unknown availability: no check


def test_the_runner_refuses_before_allocating_the_pool(monkeypatch):
    import oasis_exec.kv.layout as kv_layout
    import oasis_exec.runner.runner as runner_mod

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 1_000)  # a 1 kB host

    def no_pool(*a, **k):
        raise AssertionError("the host pool was allocated before the check")

    monkeypatch.setattr(kv_layout, "HostPool", no_pool)
    with pytest.raises(HostMemoryError, match="GB available"):
        runner_mod.Runner(ExecConfig(**TINY))


def test_bench_sizes_the_pool_for_its_concurrency_not_for_every_lane():
    from oasis_exec.tools.bench import build_bench_engine

    cfg = ExecConfig(**{**TINY, "max_context": 64 + 1 + 2 + 32}, kv_budget_gb=0.05)
    eng, n = build_bench_engine(cfg, 64, 2, 2, 1, host_fill=False)
    try:
        assert eng.max_lanes > 20 and n == 2  # the budget holds many lanes, two requests run
        assert eng.runner.host_blocks_total == 2 * cfg.max_blocks
    finally:
        eng.close()


def test_bench_cli_refuses_a_pool_the_host_cannot_hold(monkeypatch, capsys):
    from oasis_exec.__main__ import main

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2_000_000)  # 2 MB host
    rc = main(
        [
            "bench",
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--context",
            "2000",
            "--concurrency",
            "4",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--selection",
            "synthetic",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err.startswith("python -m oasis_exec bench: error: host KV pool: needs ") and "0.002 GB available" in err
