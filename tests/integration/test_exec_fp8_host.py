"""The engine with an fp8 (e4m3) host copy on the CPU (tiny random model, float32 compute): blocks really come
from the host (counters > 0), the logits stay within fp8's error of the float32-host run and of dense, every
resident slot holds its block's dequantized host copy, the pool takes a quarter of float32's bytes (half of
bfloat16's) plus the scales, and the bench record says so."""

import pytest
import torch
from exec_cases import cfg, prompts, run_logits

from oasis_core.short_context import ShortContext
from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.kv.host_quant import roundtrip

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FP8 = dict(host_kv_dtype="fp8_e4m3")
# Logit tolerance of an fp8 host copy: e4m3 keeps 3 mantissa bits (a unit's values within amax / 28); through the tiny
# model's two layers the logits (std ~1) moved by at most 0.055 in these runs. A float32 host copy: 2e-4.
FP8_TOL = 0.1
EXACT_TOL = 2e-4


def _compare(ref, out_ref, got, out, min_steps):
    """Max |logit difference| over the decode steps whose inputs are the same in both runs: the greedy tokens agree
    up to index n - 1, and decode step j's logits (``ref[rid][j]``) produce token j + 1 from tokens 0..j (after a
    divergence the inputs differ); at least ``min_steps`` such steps per request."""
    worst = 0.0
    for i, rid in enumerate(ref):
        n = next((j for j, (a, b) in enumerate(zip(out_ref[i], out[i])) if a != b), len(out[i]))
        assert n >= min_steps, (rid, n)
        for a, b in list(zip(ref[rid], got[rid]))[:n]:
            worst = max(worst, (a - b).abs().max().item())
    return worst


def _counters(c, ps, steps):
    units = []
    run_logits(c, ps, steps, lambda r: units.append(r))
    return units[0].counters()


@pytest.mark.parametrize("mode", ["lookahead", "retrieval", "hisparse"])
def test_k_covering_every_block_with_host_reads_forced_stays_within_fp8_error_of_dense(mode):
    """K covers every block and short contexts are off, so every block that fills during decode is fetched back
    from the host copy: with a float32 copy the run equals dense; with fp8 it moves, but by at most FP8_TOL."""
    ps = prompts()
    kw = dict(top_k=32, fetch_ratio=1.0, short_context=False)
    ref, out_ref = run_logits(cfg("dense"), ps, 24)
    exact, out_exact = run_logits(cfg(mode, **kw), ps, 24)
    fp8, out_fp8 = run_logits(cfg(mode, **kw, **FP8), ps, 24)
    assert out_exact == out_ref
    assert _compare(ref, out_ref, exact, out_exact, 24) <= EXACT_TOL
    d = _compare(ref, out_ref, fp8, out_fp8, 8)
    assert EXACT_TOL < d <= FP8_TOL, d  # it really read fp8 copies, and within their error
    assert _counters(cfg(mode, **kw, **FP8), ps, 24)["units_fetched"] > 0


def test_small_k_fetches_fp8_blocks_and_stays_within_fp8_error_of_the_float32_host():
    """Few resident blocks, many fetches; the selections are synthetic (the same in both runs: a model selection
    would follow the slightly different queries to other blocks, which is not what fp8 costs per block)."""
    ps = prompts(3, (90, 120))
    kw = dict(top_k=3, fetch_ratio=0.67, selection="synthetic")  # short contexts on: the lanes cross, then fetch
    ref, out_ref = run_logits(cfg("lookahead", **kw), ps, 40)
    got, out = run_logits(cfg("lookahead", **kw, **FP8), ps, 40)
    assert EXACT_TOL < _compare(ref, out_ref, got, out, 2) <= FP8_TOL  # a random model's near-ties diverge early
    c = _counters(cfg("lookahead", **kw, **FP8), ps, 40)
    assert c["units_fetched"] > 50


@pytest.mark.parametrize("mode", ["lookahead", "hisparse"])
def test_every_resident_slot_holds_its_blocks_dequantized_host_copy(mode):
    """Fetched blocks, the first working set after a prefill and a crossing lane's blocks alike (short contexts on:
    one lane starts short and crosses, one starts long)."""
    c = cfg(mode, top_k=3, fetch_ratio=0.67, max_context=700, max_lanes=2, **FP8)
    eng = Engine(c)
    r = eng.runner
    window = ShortContext(top_k=3, block_size=16).window_tokens
    for p in prompts(5, (40, 90)):
        eng.add_request(p, SamplingParams(max_tokens=500))
    steps = checked = 0
    while eng.has_work():
        eng.step()
        steps += 1
        if steps % 100 != 0:
            continue
        st, H = r.store, r.H
        for q in eng.scheduler.running.values():
            if q.n_tokens <= window:  # still short: no host copy yet
                continue
            blocks = r.model.ws.lane_blocks[q.lane]
            for l in range(r.L):
                for h in range(H):
                    row = q.lane * H + h
                    for s, b in enumerate(st.resident[l, row].tolist()):
                        if b >= 0:
                            k, v = r.host.read(l, torch.tensor([blocks[b]]), torch.tensor([h]))
                            assert torch.equal(st.k[l][row * st.W + s], k[0]), (l, q.lane, h, s, b)
                            assert torch.equal(st.v[l][row * st.W + s], v[0])
                            checked += 1
    assert checked > 100 and r.counters()["units_fetched"] > 100
    eng.close()


def test_the_first_working_set_is_the_host_copy_read_back():
    eng = Engine(cfg("lookahead", top_k=3, short_context=False, max_lanes=1, **FP8))
    eng.add_request(prompts(1, (100,))[0], SamplingParams(max_tokens=1))
    eng.step()
    r, st = eng.runner, eng.runner.store
    blocks = r.model.ws.lane_blocks[0]
    for h in range(r.H):
        for s, b in enumerate(st.resident[0, h].tolist()):
            if b >= 0:
                k, _ = r.host.read(0, torch.tensor([blocks[b]]), torch.tensor([h]))
                assert torch.equal(st.k[0][h * st.W + s], k[0])
                assert torch.equal(roundtrip(st.k[0][h * st.W + s][None])[0], k[0])  # idempotent
    eng.close()


@pytest.mark.parametrize("dtype,ratio", [("float32", 4), ("bfloat16", 2)])
def test_host_pool_takes_a_byte_an_element_plus_the_scales(dtype, ratio):
    """The pool of the same engine with fp8 codes: 1/4 of float32's bytes (1/2 of bfloat16's) plus 4 bytes per
    (layer, block, head) of K and of V; the pool sizing counts the same."""
    from oasis_core.specs import get_model
    from oasis_exec.kv.layout import build_kv_layout

    s = get_model("tiny")
    kw = dict(model="tiny", device="cpu", dtype=dtype, mode="lookahead", top_k=4, max_context=320, max_lanes=3)
    dt = getattr(torch, dtype)
    auto = build_kv_layout(ExecConfig(**kw), shape=s, dtype=dt, device=torch.device("cpu"))
    fp8 = build_kv_layout(ExecConfig(**kw, **FP8), shape=s, dtype=dt, device=torch.device("cpu"))
    assert auto.host_blocks_total == fp8.host_blocks_total == 3 * 20
    units = s.n_layers * fp8.host_blocks_total * s.n_kv_heads * 2
    assert fp8.host.nbytes == units * (16 * s.head_dim + 4)
    assert auto.host.nbytes == ratio * units * 16 * s.head_dim
    assert fp8.host.nbytes == pytest.approx(auto.host.nbytes / ratio, rel=0.02)
    assert fp8.geometry.host_bytes_per_block("fp8_e4m3") * fp8.host_blocks_total == fp8.host.nbytes
    assert fp8.store.k[0].dtype == dt  # the GPU slots keep the compute dtype


def test_the_host_memory_check_counts_the_fp8_bytes(monkeypatch):
    """A pool that fits only as fp8: the same request count is refused with the compute dtype's copy."""
    from oasis_exec.kv import host_memory
    from oasis_exec.kv.host_memory import HostMemoryError

    kw = dict(model="tiny", device="cpu", dtype="float32", mode="lookahead", top_k=4, max_context=320, max_lanes=3)
    fp8 = Engine(ExecConfig(**kw, **FP8)).runner.host.nbytes
    monkeypatch.setattr(host_memory, "available_bytes", lambda: int(fp8 / host_memory.POOL_SHARE) + 1024)
    Engine(ExecConfig(**kw, **FP8)).close()
    with pytest.raises(HostMemoryError):
        Engine(ExecConfig(**kw))


def test_bench_record_says_host_kv_dtype_pool_bytes_and_bytes_moved():
    from oasis_core.specs import get_model
    from oasis_exec.tools.bench import run_bench

    kw = dict(model="tiny", device="cpu", dtype="float32", mode="lookahead", top_k=4, selection="synthetic")
    recs = {}
    for d in ("auto", "fp8_e4m3"):
        c = ExecConfig(**kw, host_kv_dtype=d, max_context=160 + 3 + 2 + 32)  # past the short-context window
        recs[d] = run_bench(c, context=160, concurrency=2, steps=2, warmup=1)
    a, f = recs["auto"], recs["fp8_e4m3"]
    assert (a["host_kv_dtype"], f["host_kv_dtype"]) == ("auto", "fp8_e4m3")
    assert f["host_pool_bytes"] == pytest.approx(a["host_pool_bytes"] / 4, rel=0.02)
    D = get_model("tiny").head_dim
    assert (a["unit_bytes"], f["unit_bytes"]) == (2 * 16 * D * 4, 2 * (16 * D + 4))
    assert a["bytes_moved_per_step"] > 0
    assert f["bytes_moved_per_step"] / f["unit_bytes"] == a["bytes_moved_per_step"] / a["unit_bytes"]


def test_config_refuses_fp8_where_there_is_no_host_copy_or_no_fp8_gather():
    with pytest.raises(ValueError, match="host_kv_dtype"):
        ExecConfig(model="tiny", mode="dense", **FP8)
    with pytest.raises(ValueError, match="host_kv_dtype"):
        ExecConfig(model="tiny", mode="lookahead", uva_kernel="tma", **FP8)
    with pytest.raises(ValueError, match="host_kv_dtype"):
        ExecConfig(model="tiny", host_kv_dtype="fp8")
