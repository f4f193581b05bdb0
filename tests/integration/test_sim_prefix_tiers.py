"""The prefix cache's tiers (issue 15): the HBM tier comes out of the KV pool, host-tier hits pay their copy."""

import subprocess
import sys

import pytest

from oasis_core.geometry import KVGeometry
from oasis_sim.config import ConfigError, SimConfig
from oasis_sim.sim import SCATTER_EFFICIENCY, simulate
from oasis_sim.split import PrefixCache
from oasis_sim.workloads import uniform_trace

FAST = dict(top_k=16, policy_layers=1, profile_steps=8, timeline_steps=0)
CFG = SimConfig()
BPT = KVGeometry(CFG.model_spec, 16).bytes_per_token
WEIGHTS = CFG.model_spec.weight_bytes


def run(trace, **kw):
    return simulate(SimConfig(**{**FAST, **kw}), trace)


def test_tiers_report_host_hits():
    pc = PrefixCache(3 * 512 * 10.0, 1e12, 10.0)  # the HBM tier holds three 512-token blocks
    assert pc.lookup_insert_tiers((1, 2, 3), 512) == (0, 0)
    assert pc.lookup_insert_tiers((4, 5), 512) == (0, 0)  # 1 and 2 demoted to the host tier
    assert pc.lookup_insert_tiers((1, 2, 6), 512) == (2 * 512, 2 * 512)  # both promoted: 3, 4 and then 5 demoted
    assert pc.lookup_insert_tiers((1, 2, 7), 512) == (2 * 512, 0)  # in HBM now
    assert pc.lookup_insert((5, 9), 512) == 512


def test_hbm_tier_is_taken_from_the_kv_pool():
    req_kv = -(-(1000 + 8) // 16) * 16 * BPT  # one dense request's KV at its end
    hbm = (WEIGHTS + 3 * req_kv) / 0.9  # a pool of three requests' KV
    tr = uniform_trace(2, 1000, 8, prefix_ids=lambda i: (10 * i + 1, 10 * i + 2))  # no shared prefix: no hits
    both = run(tr, mode="dense", hbm_bytes=hbm).requests
    assert both[1]["admit_s"] == 0.0  # the pool holds both
    assert (
        run(tr, mode="dense", hbm_bytes=hbm, prefix_cache=True, prefix_cache_hbm_bytes=0.0).requests[1]["admit_s"]
        == 0.0
    )
    tier = run(tr, mode="dense", hbm_bytes=hbm, prefix_cache=True, prefix_cache_hbm_bytes=2 * req_kv).requests
    assert tier[1]["admit_s"] == tier[0]["finish_s"]  # a tier of two requests' KV leaves room for one


def test_a_tier_that_leaves_no_kv_pool_is_a_config_error():
    hbm_kv = 80e9 * 0.9 - WEIGHTS
    with pytest.raises(ConfigError, match="prefix_cache_hbm_bytes"):
        run(uniform_trace(1, 100, 4), prefix_cache=True, prefix_cache_hbm_bytes=hbm_kv)
    p = subprocess.run(
        [sys.executable, "-m", "oasis_sim", "run", "--prefix-cache", "--prefix-cache-hbm-bytes", "1e12", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "prefix_cache_hbm_bytes" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_a_host_tier_hit_pays_its_copy_before_prefill(mode):
    tr = uniform_trace(2, 1100, 4, gap_s=1.0, prefix_ids=lambda i: (1, 2, 3))  # the same 3 blocks of 512 tokens
    in_hbm = run(tr, mode=mode, prefix_cache=True)
    one_block = 512 * BPT * 1.5  # the HBM tier holds one block: the second request finds the others on the host
    on_host = run(tr, mode=mode, prefix_cache=True, prefix_cache_hbm_bytes=one_block)
    a, b = in_hbm.requests[1], on_host.requests[1]
    assert a["prefix_hit_tokens"] == b["prefix_hit_tokens"] == 1099
    assert a["admit_s"] == 1.0 and in_hbm.summary["prefix_host_copy_bytes"] == 0
    hw = CFG.hardware_spec
    copy_s = hw.link.latency_s + 1099 * BPT / (hw.h2d_bytes_per_s * SCATTER_EFFICIENCY)
    assert b["admit_s"] == pytest.approx(1.0 + copy_s)
    assert b["ttft_ms"] == pytest.approx(a["ttft_ms"] + 1e3 * copy_s)
    assert on_host.summary["prefix_host_copy_bytes"] == 1099 * BPT
    assert on_host.summary["h2d_bytes"] == pytest.approx(in_hbm.summary["h2d_bytes"] + 1099 * BPT)
