"""bench with real prompts: every prompt is prefilled before any request decodes, so the timed steps see all of them."""

import pytest

from oasis_exec.config import ExecConfig
from oasis_exec.tools.bench import real_prompts, run_bench


def test_real_prompts_cut_the_text_at_different_offsets():
    toks = list(range(1, 101))
    ps = real_prompts(toks, 30, 4)
    assert [len(p) for p in ps] == [30] * 4
    assert len({p[0] for p in ps}) == 4  # different offsets
    assert ps[3] == [toks[(75 + j) % 100] for j in range(30)]  # wraps around
    with pytest.raises(ValueError):
        real_prompts([], 4, 1)


@pytest.mark.parametrize("mode", ["dense", "lookahead"])
def test_bench_real_prefill_runs_every_request_in_lockstep(mode):
    cfg = ExecConfig(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode=mode,
        top_k=4,
        max_context=160,
        max_lanes=3,
        block_size=16,
        draft_vocab=64,
        prefill_chunk=48,
    )
    rec = run_bench(
        cfg, context=100, concurrency=3, steps=3, warmup=1, prompt_tokens=list(range(1, 200)), prompt_name="ids"
    )
    assert rec["concurrency"] == 3 and rec["steps"] == 3
    assert rec["prefill"] == "real (ids)" and rec["prefill_s"] > 0
    assert not rec["host_pool_filled"]
    if mode == "lookahead":
        assert rec["bytes_moved_per_step"] > 0


def test_bad_synthetic_overrides_fail_when_the_config_is_built():
    with pytest.raises(ValueError, match="ExecConfig.synthetic.*unknown preset"):
        ExecConfig(model="tiny", device="cpu", synthetic={"preset": "nope"})
    with pytest.raises(ValueError, match="ExecConfig.synthetic.*unknown field"):
        ExecConfig(model="tiny", device="cpu", synthetic={"drift": 0.1})
    with pytest.raises(ValueError, match="ExecConfig.synthetic"):
        ExecConfig(model="tiny", device="cpu", synthetic={"drift_rate": 7.0})
    assert ExecConfig(model="tiny", device="cpu", synthetic={"preset": "smollm2"}).synthetic == {"preset": "smollm2"}
