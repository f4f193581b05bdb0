"""experiments/long_context_draft on the CPU with a tiny random transformers Llama as the target: training runs end to
end for either head kind and writes the head and its bucketed acceptance; the acceptance harness counts exactly (the
target agrees with its own greedy continuation everywhere; a head's count equals a direct comparison)."""

import json
import os

import numpy as np
import pytest
import torch
from experiment_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    d = tmp_path_factory.mktemp("target")
    LlamaForCausalLM(cfg).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    g = np.random.default_rng(0)
    f = tmp_path_factory.mktemp("data") / "d.npz"
    np.savez_compressed(
        f,
        train=g.integers(0, 128, (4, 48)).astype(np.uint16),
        held=g.integers(0, 128, (2, 48)).astype(np.uint16),
        **{"text:x": g.integers(0, 128, 40).astype(np.uint16)},
    )
    return str(f)


@pytest.mark.parametrize("kind", ["attn", "single"])
def test_training_runs_end_to_end(target_dir, data_file, tmp_path, kind):
    tl = load_script("long_context_draft/train_long.py")
    out = str(tmp_path / "h")
    args = f"train --model-path {target_dir} --data {data_file} --out {out} --head {kind} --device cpu --n-train 4"
    args += " --n-gen 2 --gen-len 8 --gen-batch 1 --steps 3 --seqs 1 --picks 32 --mlp-hidden 16 --eval-gen 6"
    args += " --eval-seqs 1"
    assert tl.main(args.split()) == 0
    assert os.path.isfile(os.path.join(out, "model.safetensors"))
    doc = json.load(open(os.path.join(out, "accept.json")))
    assert doc["provenance"]["steps_done"] == 3 and doc["provenance"]["head"] == kind
    tf = doc["results"]["teacher_forced"]
    assert set(tf) == {"held", "text:x"}
    assert tf["held"][f"new-{kind}"]["0-1K"]["positions"] == 2 * 47  # entries 0 .. T - 2 of both sequences
    gen = doc["results"]["generation"]
    assert set(gen) == {"T=0", "T=0.7"}
    assert gen["T=0"]["target_vs_text"]["0-1K"]["acceptance"] == 1.0  # greedy text is the target's own top-1


def test_eval_gen_zero_is_teacher_forced_only(target_dir, data_file, tmp_path):
    tl = load_script("long_context_draft/train_long.py")
    out = str(tmp_path / "h")
    args = f"train --model-path {target_dir} --data {data_file} --out {out} --head attn --device cpu --n-train 4"
    args += " --n-gen 0 --steps 2 --seqs 1 --picks 32 --mlp-hidden 16 --eval-gen 0"
    assert tl.main(args.split()) == 0  # transformers' generate refuses 0 new tokens: no generation is asked
    res = json.load(open(os.path.join(out, "accept.json")))["results"]
    assert set(res["teacher_forced"]) == {"held", "text:x"} and res["generation"] == {}


def test_validation_keeps_the_best_checks_weights(target_dir, data_file, tmp_path, monkeypatch):
    tl = load_script("long_context_draft/train_long.py")
    out = str(tmp_path / "h")
    base = f"train --model-path {target_dir} --data {data_file} --out {out} --head attn --device cpu --n-gen 0"
    base += " --steps 5 --seqs 1 --picks 32 --mlp-hidden 16 --eval-gen -1 --val-every 2 --val-picks 40"
    with pytest.raises(SystemExit, match="holds 4 training windows"):
        tl.main((base + " --n-train 4 --val-windows 1").split())
    with pytest.raises(SystemExit, match="holds 4 training windows"):  # not silently the 4 there are
        tl.main((base + " --n-train 5").split())
    keep, seen = tl._keep_best, {}

    def spy(best, acc, step, w, log):  # every check's acceptance and weights
        seen[step] = (acc, {k: v.detach().to(torch.bfloat16).clone() for k, v in w.items()})
        return keep(best, acc, step, w, log)

    monkeypatch.setattr(tl, "_keep_best", spy)
    assert tl.main((base + " --n-train 3 --val-windows 1").split()) == 0
    assert sorted(seen) == [2, 4, 5]  # every 2 steps and the last
    best_step = max(seen, key=lambda k: (seen[k][0], -k))  # the first check of the highest acceptance
    cfg = json.load(open(os.path.join(out, "config.json")))["provenance"]
    assert cfg["val_windows"] == 1 and cfg["val_best_step"] == best_step
    assert cfg["val_best_acceptance"] == round(seen[best_step][0], 4)
    from safetensors.torch import load_file

    saved = load_file(os.path.join(out, "model.safetensors"))
    assert set(saved) == set(seen[best_step][1])
    for k, v in saved.items():  # the kept weights are that check's, not the last step's
        torch.testing.assert_close(v, seen[best_step][1][k], rtol=0, atol=0)
    if best_step != 5:
        assert any(not torch.equal(saved[k], seen[5][1][k]) for k in saved)


def test_score_counts_a_head_exactly(target_dir):
    lc = load_script("long_context_draft/longctx.py", "longctx")
    ab = load_script("long_context_draft/accept_buckets.py")
    from oasis_exec.model.draft_attn import AttnDraftHead

    t = lc.Target(target_dir, "cpu", torch.float32)
    head = AttnDraftHead.build(t.spec, t.embed, None, 128, 3, torch.float32, "cpu", t.lm_head)
    seq = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(1))
    got = ab.score(t, {"h": head}, seq, start=5)
    aux, hn = t.features(seq)
    h = lc.head_hidden(head, t.spec, aux[:, :29], t.embed[seq[0, 1:]][None])[0]
    d = head._ids(h[5:29])
    tgt = t.logits(hn[0, 6:30]).argmax(-1)
    assert got["h"]["0-1K"] == [int((d == tgt).sum()), 24]


def test_prefix_lengths_put_each_continuation_inside_its_bucket():
    """One prefix a bucket: the continuation centred in the bucket; several: spread over it, each wholly inside it,
    so that a bucket's count holds only its own positions."""
    ab = load_script("long_context_draft/accept_buckets.py")
    lc = load_script("long_context_draft/longctx.py", "longctx")
    gen = 192
    one = ab.prefix_lengths(32768, gen)
    assert one == [max(lo + (hi - lo) // 2 - gen // 2, 16) for lo, hi in lc.BUCKETS]
    three = ab.prefix_lengths(32768, gen, 3)
    for lo, hi in lc.BUCKETS:
        inside = [p for p in three if lo <= p and p + gen <= hi]
        assert len(inside) == 3 and len(set(inside)) == 3, (lo, hi, three)
    assert len(three) == 3 * len(lc.BUCKETS)
    rounds = ab.prefix_rounds(32768, gen, 3)  # every bucket's first prefix before any bucket's second
    assert rounds[: len(lc.BUCKETS)] == three[::3] and sorted(rounds) == three
    cut = ab.prefix_lengths(3000, 64, 2)  # 2-4K is cut at 3,000: its continuations end by then
    assert max(cut) + 64 == 3000 and all(p + 64 <= 3000 for p in cut)


def test_init_goes_on_from_a_saved_head(target_dir, data_file, tmp_path):
    """--init: the saved head's weights are the start (at lr 0 they come back unchanged), its provenance is kept,
    and a head of another shape is refused before training."""
    from safetensors.torch import load_file

    tl = load_script("long_context_draft/train_long.py")
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    base = f"train --model-path {target_dir} --data {data_file} --head attn --device cpu --n-train 2 --n-gen 0"
    base += " --steps 2 --seqs 1 --picks 32 --mlp-hidden 16 --eval-gen -1"
    assert tl.main(f"{base} --out {first} --seed 1".split()) == 0
    assert tl.main(f"{base} --out {second} --seed 2 --lr 0 --init {first}".split()) == 0
    a, b = load_file(os.path.join(first, "model.safetensors")), load_file(os.path.join(second, "model.safetensors"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0)
    prov = json.load(open(os.path.join(second, "config.json")))["provenance"]
    assert prov["init"]["path"] == first and prov["init"]["provenance"]["seed"] == 1
    with pytest.raises(SystemExit, match="--init .*mlp.gate_proj.weight"):
        tl.main(f"{base} --out {tmp_path / 'c'} --mlp-hidden 8 --init {first}".split())


def test_by_position_buckets_the_per_position_figures():
    """by_position.py: bucket means of the per-position agreement and token hits, and the gap to the oracle."""
    mod = load_script("long_context_draft/by_position.py")
    assert mod.buckets([1, 2, 3, 4, 5, 6], 3) == [1.5, 3.5, 5.5]
    avg = {
        "texts": ["a", "b"],
        "proxy_per_position": [0.5, 0.5, 0.7, 0.7],
        "drafts": {
            "ngram_attn": {"sparse_per_position": [0.8, 0.8, 0.9, 0.95], "right_per_position": [0.5, 0.5, 1.0, 1.0]},
            "oracle": {"sparse_per_position": [1.0, 1.0, 1.0, 1.0], "right_per_position": [1.0] * 4},
        },
    }
    out = mod.table({"average": {"8192@K64": avg}, "generation": "greedy"}, 2)
    assert "| 1-2 | 50.0 | 80.0 (50) | 100.0 (100) |" in out
    assert "| 3-4 | 70.0 | 92.5 (100) | 100.0 (100) |" in out
    assert "ngram_attn below the oracle, points by bucket: 20.0, 7.5" in out
    with pytest.raises(SystemExit, match="no per-position"):
        mod.table({"average": {"k": {"texts": []}}}, 2)


def test_accuracy_needed_splits_agreement_by_token_and_solves_for_the_gap():
    """accuracy_needed.py: a draft's agreement where its token was right and where wrong, pooled over texts, and the
    accuracy that puts it ``gap`` points under the oracle."""
    mod = load_script("long_context_draft/accuracy_needed.py")
    assert mod.needed(98.0, 98.0, 70.0, 3.0) == pytest.approx(25 / 28)
    # two texts, 4 positions each; the draft right at positions 1, 2 of text a and 1 of text b
    res = [
        {
            "n_tokens": 100,
            "k": 8,
            "proxy_per_position": [0.7] * 4,
            "drafts": {
                "pair": {"right_per_position": right, "sparse_per_position": agree},
                "oracle": {"right_per_position": [1.0] * 4, "sparse_per_position": [0.98] * 4},
            },
        }
        for right, agree in (([1, 1, 0, 0], [0.96, 0.98, 0.70, 0.72]), ([1, 0, 0, 0], [0.97, 0.71, 0.69, 0.70]))
    ]
    by = mod.pooled({"results": res})[(100, 8)]
    assert by["pair"][0] == [1, 1, 0, 0, 1, 0, 0, 0]
    lines = mod.rows({"results": res}, 3.0, first=2)
    # A_right (96 + 98 + 97) / 3 = 97.0, A_wrong (70 + 72 + 71 + 69 + 70) / 5 = 70.4; right 3 of 8, 3 of the first 2 x 2
    assert lines == [
        f"| 100 | 8 | pair | 98.0 | 70.0 | 97.0 | 70.4 | 80.4 | 38 / 75 | **{100 * (98 - 3 - 70.4) / (97 - 70.4):.0f}** |"
    ]
    with pytest.raises(SystemExit, match="positions"):
        mod.positions({"results": [{"proxy_per_position": [0.5]}, {"proxy_per_position": [0.5, 0.5]}]})
