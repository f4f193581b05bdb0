"""Prefill/decode split with remote partial fetching for real (``oasis_exec.tools.rpf_split``): two processes over gloo.
The decode node's host pool starts as NaN, so its greedy tokens equal a one-process run's only if every unit it read
arrived; the ledger's and the prefill node's own counts show each unit crossed at most once and never more than the
fetch cap a row and step; an RPF hand-off carries fewer bytes than a full one and the remote fetches make up for
it. The tiny dummy preset (fast) and the real model (SmolLM2-135M, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_model_cases import shlex_ids

from oasis_core.block_scorers import DEFAULT_SCORER
from oasis_exec.config import DRAFT_NGRAM, ExecConfig
from oasis_exec.tools import rpf_split
from oasis_exec.tools.tp_generate import generate_greedy

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DRAFT = Path(__file__).resolve().parents[2] / "experiments" / "trained_draft_head" / "smollm2-eagle3"


def _check(cfg, prompt, n, handoffs=("rpf", "full")):
    ref = generate_greedy(rpf_split.split_config(cfg), [prompt], n)["tokens"][0]  # what the split runs
    runs = {h: rpf_split.split_run(cfg, prompt, n, handoff=h, probe=False) for h in handoffs}
    for h, r in runs.items():
        d, p = r["decode"], r["prefill"]
        assert d["tokens"] == ref, h
        assert p["units_crossed_twice"] == 0
        assert (
            d["ledger_units_sent"] == d["handoff_units"] + d["remote_units"] == p["units_served"] + d["handoff_units"]
        )
        assert d["max_remote_units_per_row_step"] <= d["cap_units_per_row_step"]
        assert sum(d["remote_units_per_step"]) == d["remote_units"]
        assert r["ttft_s"] >= p["prefill_s"] > 0
        assert d["wire_bytes"].get("remote", 0) == d["remote_units"] * d["unit_bytes"]
    rpf = runs["rpf"]["decode"]
    assert 0 < rpf["handoff_units"] * rpf["unit_bytes"] < rpf["full_kv_bytes"] and rpf["remote_units"] > 0
    if "full" not in runs:
        return runs
    full = runs["full"]["decode"]
    assert full["remote_units"] == 0 and full["handoff_units"] * full["unit_bytes"] == full["full_kv_bytes"]
    assert 0 < rpf["handoff_units"] < full["handoff_units"]
    assert rpf["wire_bytes"]["blocks"] < full["wire_bytes"]["blocks"]
    return runs


def test_split_tiny():
    cfg = ExecConfig(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode="lookahead",
        block_size=4,
        top_k=6,
        max_context=400,
        short_context=False,
        fetch_ratio=0.34,
    )
    _check(cfg, [(3 * j + 1) % 200 + 1 for j in range(150)], 60)


def test_split_runs_without_prompt_lookup():
    """The hand-off sends no token ids, so the split turns prompt lookup off on both nodes, lookahead's default
    (DRAFT_NGRAM) or given (the reference run above takes the same configuration)."""
    cfg = ExecConfig(model="tiny", device="cpu", mode="lookahead", short_context=False)
    assert cfg.draft_ngram == DRAFT_NGRAM == 2 and rpf_split.split_config(cfg).draft_ngram == 0
    cfg = ExecConfig(model="tiny", device="cpu", mode="lookahead", short_context=False, draft_ngram=3)
    assert rpf_split.split_config(cfg).draft_ngram == 0


def test_split_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="short_context off"):
        rpf_split.split_run(ExecConfig(model="tiny", device="cpu"), [1, 2, 3], 4)
    with pytest.raises(ValueError, match="short_context off"):
        rpf_split.split_run(ExecConfig(model="tiny", device="cpu", mode="dense", short_context=False), [1, 2, 3], 4)
    with pytest.raises(ValueError, match="the CPU only"):
        rpf_split.split_run(ExecConfig(model="tiny", device="cuda", short_context=False), [1, 2, 3], 4)


@pytest.mark.slow
def test_split_real_model():
    """SmolLM2-135M with the trained draft head, 512 prompt tokens, top-K 8, the model's own selection; the RPF
    hand-off only (the full one and the comparison of the two are the tiny case's: each split run loads the model
    in two processes, ~14 s each on a 2-core CPU)."""
    from oasis_exec.model.gguf import smollm2_path

    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    ids = shlex_ids(path, 512)
    cfg = ExecConfig(
        model_path=path,
        draft_path=str(DRAFT),
        device="cpu",
        dtype="float32",
        mode="lookahead",
        top_k=8,
        max_context=640,
        short_context=False,
        block_score=DEFAULT_SCORER,  # the hand-off sends no per-token channels (auto would be tokens here)
    )
    _check(cfg, ids, 24, handoffs=("rpf",))
