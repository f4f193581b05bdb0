"""Decode chains (``ExecConfig.decode_chain``): several ordinary decode steps a scheduler step, each step's tokens
fed to the next on the device, one host read a chain. On the CPU in fp32, the tiny model, requests at different
positions (chains cross block boundaries at different steps in different lanes):

- greedy output and the whole KV state after the run (GPU slots, tables, summaries, host copies, draft tokens) equal
  those of the run without chains, in every mode, with model and with synthetic selections;
- a stop token inside a chain ends the request there (the tokens after it are cut), as without chains;
- rows above temperature 0, a speculative config and recorded sets never chain; the engine's steps emit up to
  ``decode_chain`` tokens a request and never past ``max_tokens``;
- after chains, every resident slot holds its block's host copy (real prefill);
- the config refuses chains past ``block_size``; the bench reports TPOT per token; ``--record`` refuses a chain.
"""

import pytest
import torch
from exec_cases import cfg, chains_of, prompts, run_synthesized, slots_hold_their_blocks

from oasis_exec.config import ExecConfig
from oasis_exec.engine.engine import Engine
from oasis_exec.engine.scheduler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N = 37  # output tokens a request: not a multiple of the chains below, so the last chain of each is cut short


def _run(c, ps, sampling=None):
    return run_synthesized(c, ps, N, sampling)


def _state(eng, ps):
    """The KV state after the run, host copies by (lane, logical block): a chain takes its host blocks after its
    last step, so the physical blocks a request holds may differ; what they hold may not."""
    r = eng.runner
    st = r.store
    names = ("k", "v", "kmin", "kmax", "resident", "last_sel")
    out = {n: getattr(st, n) for n in names if getattr(st, n, None) is not None}
    if r.drafts.tok is not None:
        out["draft_tok"] = r.drafts.tok
    out = {n: (torch.stack(list(t)) if isinstance(t, (list, tuple)) else t).clone() for n, t in out.items()}
    if r.host is not None:
        for lane, p in enumerate(ps):  # lane i holds request i (admitted in order, all at once)
            full = (len(p) + N - 1) // r.bs  # blocks filled by the end (their host copies written)
            blocks = st.host_table[lane, :full]  # the pool is [host block, head, bs, D] a layer
            out[f"host_k{lane}"] = torch.stack([t[blocks] for t in r.host.k])
            out[f"host_v{lane}"] = torch.stack([t[blocks] for t in r.host.v])
    return out


OFF = {"short_context": False}  # short lanes never chain (test_chain_length_bounds): every request offloaded
CASES = [
    ("dense", {}),
    ("lookahead", OFF),
    ("lookahead", {**OFF, "selection": "synthetic", "synthetic": {"preset": "smollm2"}}),
    ("lookahead", {"lens": (90, 100, 120)}),  # short context on, every prompt past the resident set
    ("proxy", OFF),
    ("quest", {}),
    ("retrieval", OFF),
    ("hisparse", OFF),
]


def _case_id(mode, kw):
    return "-".join([mode, kw.get("selection", "model")] + (["short"] if kw.get("short_context", True) else []))


@pytest.mark.parametrize("mode,kw", CASES, ids=[_case_id(m, kw) for m, kw in CASES])
def test_chained_steps_equal_single_steps(mode, kw):
    kw = dict(kw)
    ps = prompts(3, lens=kw.pop("lens", (70, 33, 100)))
    ref_eng, ref, ref_steps = _run(cfg(mode, **kw), ps)
    eng, out, steps = _run(cfg(mode, decode_chain=16, **kw), ps)
    assert out == ref and all(len(o) == N for o in out)
    assert max(ref_steps) == 1 and max(steps) == 16  # chains ran, and one of the full length
    assert len(steps) < len(ref_steps) / 4
    a, b = _state(ref_eng, ps), _state(eng, ps)
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n
    ref_eng.close()
    eng.close()


@pytest.mark.parametrize("block_score", ["minmax", "minmax_sum+sink"])
def test_slots_hold_their_host_blocks_after_chains(block_score):
    """After three chains of 8 (real prefill; lookahead's background copies chained too), every resident slot
    holds its block's host copy, the sink-pinned block (``+sink``: resident from the first working set on) included."""
    c = cfg("lookahead", decode_chain=8, top_k=3, fetch_ratio=0.67, short_context=False, block_score=block_score)
    eng = Engine(c)
    assert chains_of(eng, prompts(13, (90, 120, 64)), 8, 3) == 3
    assert slots_hold_their_blocks(eng) > 0
    eng.close()


def test_stop_token_inside_a_chain_ends_the_request_there():
    ps = prompts(5)
    _, ref, _ = _run(cfg("lookahead", **OFF), ps)
    stop = ref[0][9]  # request 0 stops at its 10th token, inside its first chain of 16
    sp = SamplingParams(max_tokens=N, stop_ids=(stop,))
    _, want, _ = _run(cfg("lookahead", **OFF), ps, sp)
    eng, got, steps = _run(cfg("lookahead", decode_chain=16, **OFF), ps, sp)
    assert max(steps) == 16
    assert got == want
    assert len(got[0]) <= 10 and got[0][-1] == stop
    eng.close()


def test_sampled_rows_never_chain():
    ps = prompts(1)
    sp = SamplingParams(max_tokens=12, temperature=0.8, seed=3)
    _, want, _ = _run(cfg("lookahead", **OFF), ps, sp)
    eng, got, steps = _run(cfg("lookahead", decode_chain=8, **OFF), ps, sp)
    assert got == want and max(steps) == 1
    eng.close()


def _call(max_new, chain=8):
    from oasis_exec.engine.scheduler import DecodeItem, RunnerCall

    return RunnerCall(decode=tuple(DecodeItem(i, i, 1, 40, m) for i, m in enumerate(max_new)), chain=chain)


def test_chain_length_bounds():
    c = cfg("lookahead", decode_chain=8)
    eng = Engine(c)
    r = eng.runner
    g = SamplingParams(max_tokens=4)
    assert r._chain_len(_call([3, 20]), [g, g], "none", []) == 3  # the batch's fewest remaining tokens
    assert r._chain_len(_call([20]), [g], "none", []) == 8
    assert r._chain_len(_call([20], chain=1), [g], "none", []) == 1  # the engine's call allows none
    assert r._chain_len(_call([20], chain=16), [g], "none", []) == 16  # at most block_size (16)
    assert r._chain_len(_call([20]), [g], "some", []) == 1  # a lane may be short: it could cross inside the chain
    assert r._chain_len(_call([20]), [g], "none", [0]) == 1
    assert r._chain_len(_call([20]), [SamplingParams(temperature=0.5)], "none", []) == 1
    eng.close()
    assert ExecConfig(model="tiny", block_size=16, decode_chain=17).chain_max == 16  # one block filled at most
    assert ExecConfig(model="tiny", decode_chain=8, profile=True).chain_max == 1
    assert ExecConfig(mode="dense", decode_chain=8, speculative_k=2).chain_max == 1
    with pytest.raises(ValueError, match="decode_chain"):
        ExecConfig(model="tiny", decode_chain=0)
    assert ExecConfig(mode="dense", decode_chain=6).step_tokens_max == 6
    assert ExecConfig(mode="dense", speculative_k=3, decode_chain=2, spec_chain=1).step_tokens_max == 4
    assert ExecConfig(mode="dense", speculative_k=3).step_tokens_max == 16  # speculative steps chain 16 // 4


def test_engine_chains_only_when_nothing_else_waits():
    """No chain while a prefill is under way or a queued request has a free lane (it would wait for the chain), nor
    with a sampler a harness installed; chains once every admitted request decodes."""
    c = cfg("lookahead", decode_chain=8, max_lanes=2, **OFF)
    eng = Engine(c)
    ps = prompts(4, lens=(70, 60, 50))
    sp = SamplingParams(max_tokens=30)
    for p in ps:  # real prefill, in chunks of 48 tokens; 2 lanes for 3 requests
        eng.add_request(p, sp)
    seen = []
    while eng.has_work():
        running = eng.scheduler.running
        busy = any(r.state != "decode" for r in running.values()) or bool(eng.scheduler.waiting and eng.acct.free_lanes)
        got = eng.step()
        n = max((len(o.new_token_ids) for o in got), default=0)
        seen.append(n)
        if busy:
            assert n <= 1
    assert max(seen) == 8  # the two first requests decode alone, chained; the third waits for a lane
    eng.close()
    _, ref, _ = run_synthesized(cfg("lookahead", **OFF), ps, 12)
    eng = Engine(cfg("lookahead", decode_chain=8, **OFF))
    eng.runner.host.fill_pattern(0)
    for p in ps:
        eng.add_request(p, SamplingParams(max_tokens=12), synthetic_prefill=True)
    inner = eng.sampler
    eng.sampler = lambda logits, params: inner(logits, params)  # a harness's sampler: per step
    out = {}
    while eng.has_work():
        for o in eng.step():
            assert len(o.new_token_ids) == 1
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert list(out.values()) == ref
    eng.close()


def test_speculative_config_never_chains():
    ps = prompts(2, lens=(40, 21))
    eng, _, steps = _run(cfg("dense", speculative_k=2, decode_chain=8), ps)
    assert eng.runner._chain_len(_call([20]), [SamplingParams()], "none", []) == 1
    assert max(steps) <= 3
    eng.close()


def test_bench_reports_tpot_per_token(tmp_path):
    from oasis_exec.tools.bench import run_bench

    c = cfg("lookahead", decode_chain=4, max_context=4096, max_lanes=2, **OFF)
    rec = run_bench(c, context=64, concurrency=2, steps=3, warmup=1, host_fill=False)
    assert rec["decode_chain"] == 4 and rec["steps"] == 3
    assert rec["accepted_tokens_per_step"] == pytest.approx(4.0)  # every timed step gave each request 4 tokens
    assert rec["tpot_ms_p50"] == pytest.approx(rec["step_ms_p50"] / 4)
    assert rec["tpot_ms_mean"] == pytest.approx(rec["step_ms_mean"] / 4)


def test_record_runs_single_steps(tmp_path, capsys):
    """``bench --record`` runs one decode step a scheduler step (what the simulator replays), and says so."""
    from oasis_exec.__main__ import build_parser, prepare_bench

    a = build_parser().parse_args(
        ["bench", "--device", "cpu", "--model", "tiny", "--decode-chain", "4", "--record", str(tmp_path / "r.json")]
        + ["--record-hardware", "h200"]
    )
    cfg, bc = prepare_bench(a)
    assert cfg.decode_chain == 1 and cfg.max_context == bc.engine_max_context(cfg.block_size)
    assert "decode_chain 4 -> 1" in capsys.readouterr().err
    a = build_parser().parse_args(
        [
            "bench",
            "--device",
            "cpu",
            "--model",
            "tiny",
            "--record",
            str(tmp_path / "r.json"),
            "--record-hardware",
            "h200",
        ]
    )
    assert prepare_bench(a)[0].decode_chain == 1  # the default chain too
    assert f"decode_chain {ExecConfig.decode_chain} -> 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="decode_chain 4"):
        from oasis_exec.tools.recorder import recording_from_bench

        recording_from_bench({"decode_chain": 4, "mode": "dense", "steps": 1}, exec_config=cfg, hardware="h200")


def test_record_runs_single_speculative_steps(tmp_path, capsys):
    """Speculative steps likewise: ``bench --record`` turns the default ``spec_chain`` off and says so, and a bench
    record whose speculative steps chained is not a recording."""
    from oasis_exec.__main__ import build_parser, prepare_bench
    from oasis_exec.tools.recorder import recording_from_bench

    argv = ["bench", "--device", "cpu", "--model", "tiny", "--mode", "dense", "--speculative-k", "1"]
    cfg, _ = prepare_bench(build_parser().parse_args(argv))
    assert cfg.spec_chain_max == 8  # not recording: the default chain
    argv += ["--record", str(tmp_path / "r.json"), "--record-hardware", "h200"]
    cfg, _ = prepare_bench(build_parser().parse_args(argv))
    assert cfg.spec_chain == 1 and cfg.spec_chain_max == 1
    assert f"spec_chain {ExecConfig.spec_chain} -> 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="spec_chain 8"):
        recording_from_bench({"spec_chain": 8, "mode": "dense", "steps": 1}, exec_config=cfg, hardware="h200")
