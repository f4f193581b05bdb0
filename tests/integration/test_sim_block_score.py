"""SimConfig.block_score: the scoring reads the summary vectors the scorer uses (mean: one of two), nothing else
changes; unknown names are refused."""

import pytest

from oasis_sim.config import SimConfig
from oasis_sim.sim import simulate
from oasis_sim.workloads import uniform_trace

FAST = dict(top_k=16, policy_layers=1, profile_steps=8, timeline_steps=5)


def test_mean_reads_half_the_summaries_and_selects_the_same():
    tr = uniform_trace(4, 1500, 12, gap_s=0.01)
    base = simulate(SimConfig(**FAST, mode="quest"), tr).summary
    same = simulate(SimConfig(**FAST, mode="quest", block_score="gauss+sink"), tr).summary
    half = simulate(SimConfig(**FAST, mode="quest", block_score="mean"), tr).summary
    assert same["tpot_ms_p50"] == base["tpot_ms_p50"]  # two vectors read, as min/max
    assert half["tpot_ms_p50"] < base["tpot_ms_p50"]  # one vector: a cheaper scoring pass
    assert half["output_tokens"] == base["output_tokens"] and half["resident_recall"] == base["resident_recall"]


def test_unknown_scorer_is_refused():
    with pytest.raises(ValueError, match="block_score: must be one of minmax"):
        SimConfig(block_score="median")


def test_tokens_stores_and_reads_its_channels():
    """block_score=tokens: bs * token_rank values a block and head, all read; at token_rank = D / 8 (16 of Qwen3-8B's
    128 at block 16) that is min/max's 2 D, at the default D / 4 twice it."""
    tr = uniform_trace(4, 1500, 12, gap_s=0.01)
    base = simulate(SimConfig(**FAST, mode="quest"), tr).summary
    same = simulate(SimConfig(**FAST, mode="quest", block_score="tokens", token_rank=16), tr).summary
    twice = simulate(SimConfig(**FAST, mode="quest", block_score="tokens"), tr).summary
    assert same["tpot_ms_p50"] == base["tpot_ms_p50"]
    assert twice["tpot_ms_p50"] > base["tpot_ms_p50"]
    assert twice["output_tokens"] == base["output_tokens"] and twice["resident_recall"] == base["resident_recall"]


def test_odd_token_rank_is_refused():
    with pytest.raises(ValueError, match="token_rank"):
        SimConfig(block_score="tokens", token_rank=3)
