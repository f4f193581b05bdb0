"""``block_score=auto``, the engine's default (``oasis_exec.scorer_auto``): ``tokens`` with the shipped basis for real
weights of a model whose basis ships (Gemma 3 270M r = 64, SmolLM2-135M r = 24), ``minmax_sum+sink`` for dummy
weights, other models, ``spec_predict=beside`` and tensor parallelism; a given scorer wins; the config holds, and the
bench record names, the scorer that runs. The model's identity is its shape: the real GGUFs are read where installed,
the other cases use small Hugging Face directories of a preset's shape (config.json only: nothing loads weights)."""

import json
import os

import pytest

from oasis_core.block_scorers import AUTO, DEFAULT_SCORER, TOKENS
from oasis_core.specs import MODELS, get_model
from oasis_exec import scorer_auto
from oasis_exec.config import ExecConfig, replace_config
from oasis_exec.model.decoder import hf_config
from oasis_sim.config import SimConfig


def _hf_dir(tmp_path, spec, name="m"):
    """A Hugging Face directory whose config.json is ``spec``'s (what ``read_hf_config`` reads)."""
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf_config(spec)))
    return str(d)


def test_the_default_is_auto_and_dummy_weights_get_the_two_vector_scorer():
    assert ExecConfig.__dataclass_fields__["block_score"].default == AUTO
    for model in ("qwen3-8b", "smollm2-135m", "gemma3-270m", "tiny"):  # a preset alone: dummy weights
        c = ExecConfig(model=model, device="cpu")
        assert (c.block_score, c.token_basis, c.token_rank) == (DEFAULT_SCORER, None, 0), model
        assert c.block_score_auto.startswith("dummy weights")
    assert SimConfig().block_score == SimConfig(block_score=AUTO).block_score == DEFAULT_SCORER  # no weights there
    assert SimConfig(model="gemma3-270m").block_score == DEFAULT_SCORER


def test_a_real_smollm2_shape_gets_tokens_with_its_basis_at_r24(tmp_path):
    path = _hf_dir(tmp_path, MODELS["smollm2-135m"])
    c = ExecConfig(model_path=path, device="cpu")
    assert c.block_score == TOKENS and c.token_rank == 24
    assert c.token_basis == str(scorer_auto.SHIPPED_BASES["smollm2-135m"][0]) and os.path.isfile(c.token_basis)
    assert c.block_score_auto == "smollm2-135m basis"
    assert ExecConfig(model_path=path, device="cpu", token_rank=16).token_rank == 16  # a rank given wins
    own = ExecConfig(model_path=path, device="cpu", token_basis="own.npz")  # a basis of one's own replaces it
    assert (own.block_score, own.token_basis) == (TOKENS, "own.npz")


def test_other_real_models_and_disallowed_configs_get_the_two_vector_scorer(tmp_path):
    smol = _hf_dir(tmp_path, MODELS["smollm2-135m"])
    other = _hf_dir(tmp_path, get_model("tiny"), "tiny")  # a real checkpoint of no shipped basis's shape
    cases = {
        "no basis ships": dict(model_path=other),
        "spec_predict=beside": dict(model_path=smol, mode="lookahead", speculative_k=2, spec_predict="beside"),
        "tensor_parallel > 1": dict(model_path=smol, tensor_parallel=2),
        "no basis ships ": dict(model_path=str(tmp_path / "missing")),  # unreadable: the loader reports it later
    }
    for why, kw in cases.items():
        c = ExecConfig(device="cpu", **kw)
        assert (c.block_score, c.token_basis) == (DEFAULT_SCORER, None), why
        assert c.block_score_auto.startswith(why.strip()), (why, c.block_score_auto)
    with pytest.raises(ValueError, match="ExecConfig.token_basis: .*what block_score=auto became: no basis ships"):
        ExecConfig(model_path=other, device="cpu", token_basis="b.npz")


def test_a_given_scorer_wins(tmp_path):
    smol = _hf_dir(tmp_path, MODELS["smollm2-135m"])
    for s in ("minmax_sum+sink", "minmax", "mean+sink"):
        c = ExecConfig(model_path=smol, device="cpu", block_score=s)
        assert (c.block_score, c.token_basis, c.block_score_auto) == (s, None, None)
    c = ExecConfig(model="qwen3-8b", device="cpu", block_score=TOKENS)  # tokens on dummy weights: first pairs
    assert (c.block_score, c.token_basis, c.block_score_auto) == (TOKENS, None, None)
    with pytest.raises(ValueError, match="ExecConfig.spec_predict"):  # given, tokens still refuses beside
        ExecConfig(model_path=smol, device="cpu", block_score=TOKENS, spec_predict="beside")


def test_a_replaced_config_keeps_the_resolved_scorer_and_why(tmp_path):
    c = ExecConfig(model_path=_hf_dir(tmp_path, MODELS["smollm2-135m"]), device="cpu")
    r = replace_config(c, max_context=4096)
    assert (r.block_score, r.token_basis, r.token_rank, r.block_score_auto) == (
        TOKENS,
        c.token_basis,
        24,
        "smollm2-135m basis",
    )
    d = replace_config(c, block_score="mean", token_basis=None)
    assert (d.block_score, d.block_score_auto) == ("mean", None)


def test_rpf_split_falls_back_where_auto_chose_tokens(tmp_path):
    from oasis_exec.tools import rpf_split

    kw = dict(device="cpu", mode="lookahead", short_context=False)
    c = rpf_split.split_config(ExecConfig(model_path=_hf_dir(tmp_path, MODELS["smollm2-135m"]), **kw))
    assert (c.block_score, c.token_basis, c.token_rank) == (DEFAULT_SCORER, None, 0)
    assert "rpf_split" in c.block_score_auto
    with pytest.raises(ValueError, match="per-token summaries"):  # tokens given is refused, as before
        rpf_split.split_config(ExecConfig(model="tiny", block_score=TOKENS, **kw))


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_the_real_ggufs_resolve_to_their_basis(which):
    """The checkpoints the bases were fitted on, read as the loader reads them (skipped where not installed)."""
    if which == "smollm2":
        from oasis_exec.model.gguf import smollm2_path as find

        preset, rank = "smollm2-135m", 24
    else:
        from oasis_exec.model.gemma3_files import gemma3_path as find

        preset, rank = "gemma3-270m", 64
    try:
        path = find()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    c = ExecConfig(model_path=path, device="cpu", max_context=4096)
    assert (c.block_score, c.token_rank, c.block_score_auto) == (TOKENS, rank, f"{preset} basis")
    assert c.token_basis == str(scorer_auto.SHIPPED_BASES[preset][0])


def test_the_bench_record_names_the_scorer_that_ran():
    from oasis_exec.tools.bench import run_bench

    base = dict(model="tiny", device="cpu", dtype="float32", mode="quest", top_k=2, max_context=256, cuda_graph=False)
    rec = run_bench(ExecConfig(**base), context=64, concurrency=1, steps=2, warmup=1)
    assert (rec["block_score"], rec["token_rank"], rec["token_basis"]) == (DEFAULT_SCORER, None, None)
    assert rec["block_score_auto"].startswith("dummy weights")
    rec = run_bench(ExecConfig(**base, block_score=TOKENS), context=64, concurrency=1, steps=2, warmup=1)
    assert (rec["block_score"], rec["block_score_auto"], rec["token_basis"]) == (TOKENS, None, None)
    assert rec["token_rank"] == get_model("tiny").head_dim // 4


def test_a_basis_replaced_into_two_ranks_is_refused_clearly(tmp_path):
    """auto's shipped basis (tensor_parallel 1) carried by ``dataclasses.replace`` into two ranks: the config says why
    (a basis holds every KV head of a layer), not the rank's store three layers down."""
    import dataclasses

    c = ExecConfig(model_path=_hf_dir(tmp_path, MODELS["smollm2-135m"]), device="cpu", mode="lookahead")
    assert c.block_score == TOKENS and c.token_basis
    with pytest.raises(ValueError, match="not split over ranks"):
        dataclasses.replace(c, tensor_parallel=2)
