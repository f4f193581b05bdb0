"""The simulator's fp8 host copy (``SimConfig.host_kv_dtype``): host bytes per block, PCIe bytes per fetched block and
the GPU->host offloads halve (plus the scales), the GPU side does not change, and recordings carry the field into
the replay."""

import pytest

from oasis_core.geometry import KVGeometry
from oasis_core.recording import closed_loop_requests, load_recording
from oasis_core.specs import get_model
from oasis_core.trace import Trace
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.sim import simulate

QUICK = dict(hardware="h200", timeline_steps=0, policy_layers=1, profile_steps=8)


def _run(mode="lookahead", **kw):
    cfg = SimConfig(mode=mode, concurrency=4, **QUICK, **kw)
    return simulate(cfg, Trace(closed_loop_requests(4, 4096, 16))).summary


@pytest.mark.parametrize("mode", ["lookahead", "retrieval", "hisparse"])
def test_host_and_pcie_bytes_halve_with_an_fp8_host_copy(mode):
    geo = KVGeometry(get_model("qwen3-8b"), 16)
    ratio = geo.host_bytes_per_block_head("fp8_e4m3") / geo.bytes_per_block_head
    assert ratio == (16 * 128 + 4) / (2 * 16 * 128)  # 4,104 of 8,192 bytes: half, plus two scales
    a, f = _run(mode), _run(mode, host_kv_dtype="fp8_e4m3")
    assert a["h2d_bytes"] > 0
    for key in ("h2d_bytes", "d2h_bytes"):
        assert f[key] == pytest.approx(a[key] * ratio, rel=1e-6), key
    assert f["host_peak_bytes"] == pytest.approx(a["host_peak_bytes"] * ratio, rel=1e-6)
    assert f["hbm_peak_bytes"] == a["hbm_peak_bytes"]  # the GPU's working set keeps the KV dtype
    assert f["tpot_ms_p50"] <= a["tpot_ms_p50"]  # fewer bytes a copy: never slower
    assert f["host_kv_dtype"] == "fp8_e4m3" and "host_kv_dtype" not in a  # default summaries keep their bytes


def test_fp8_host_copy_needs_a_sparse_mode_on_one_node():
    with pytest.raises(ConfigError, match="host_kv_dtype"):
        SimConfig(mode="dense", host_kv_dtype="fp8_e4m3")
    with pytest.raises(ConfigError, match="host_kv_dtype"):
        SimConfig(mode="lookahead", split="full", host_kv_dtype="fp8_e4m3")
    with pytest.raises(ConfigError, match="host_kv_dtype"):
        SimConfig(mode="lookahead", host_kv_dtype="int8")


def test_recordings_carry_host_kv_dtype_into_the_replay(tmp_path):
    from replay_fakes import base_config, fake_results

    from oasis_core.recording import RecordingError, build_recording
    from oasis_exec.tools.recorder import write_bench_recording
    from oasis_sim.replay import sim_config

    bench = {
        "mode": "lookahead",
        "context": 4096,
        "concurrency": 4,
        "steps": 8,
        "warmup": 2,
        "throughput_tok_s": 100.0,
        "tpot_ms_p50": 10.0,
        "tpot_ms_p99": 11.0,
        "bytes_moved_per_step": 1e6,
        "selection": "synthetic",
        "transfer": "uva",
        "fetch_ratio": 0.05,
        "top_k": 32,
        "model": "qwen3-8b",
        "device": "NVIDIA H200",
    }
    for d in ("fp8_e4m3", "auto", None):
        b = dict(bench, host_kv_dtype=d) if d else dict(bench)
        rec = write_bench_recording(str(tmp_path / f"r{d}.json"), b, {"block_size": 16, "model": "qwen3-8b"})
        back = load_recording(rec.source)
        assert back.config["host_kv_dtype"] == (d or "auto")
        assert sim_config(back).host_kv_dtype == (d or "auto")
    with pytest.raises(RecordingError, match="host_kv_dtype"):
        build_recording(dict(base_config(), host_kv_dtype="fp4"), fake_results())
