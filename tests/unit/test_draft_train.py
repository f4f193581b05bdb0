"""oasis_exec.tools.draft_train on the tiny dummy model: the corpus split, the cached greedy generation against the plain
forward, and training that moves acceptance; the committed SmolLM2 head loads in its layout."""

import os

import numpy as np
import pytest
import torch

from oasis_core.specs import get_model
from oasis_exec.model.decoder import Decoder
from oasis_exec.model.draft import DraftHead, draft_logits
from oasis_exec.tools.draft_train import (
    acceptance,
    build_corpus,
    features,
    forward_batch,
    generate_greedy,
    held_out,
    init_head,
    train_head,
)

HEAD = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "trained_draft_head", "smollm2-eagle3")


@pytest.fixture(scope="module")
def dec():
    return Decoder.build(get_model("tiny"), None, seed=3, dtype=torch.float32, device="cpu")


def test_corpus_keeps_held_out_files_apart(tmp_path):
    files = []
    for i in range(40):
        f = tmp_path / f"doc{i}.txt"
        f.write_text(" ".join(f"w{i}_{j}" for j in range(50)))
        files.append(str(f))
    assert any(held_out(f) for f in files) and not all(held_out(f) for f in files)
    c = build_corpus(lambda t: [hash(w) % 1000 for w in t.split()], files, 16, 4, 10, seed=1)
    assert c["train"].shape == (16, 10) and c["held"].shape == (4, 10) and c["train"].dtype == np.int32
    assert not set(c["train_files"]) & set(c["held_files"])
    assert all(held_out(f) for f in c["held_files"]) and not any(held_out(f) for f in c["train_files"])


def test_cached_greedy_generation_equals_the_plain_forward(dec):
    prompts = torch.randint(1, dec.shape.vocab, (3, 7), generator=torch.Generator().manual_seed(0))
    out = generate_greedy(dec, prompts, 5, batch=2)
    assert out.shape == (3, 12) and torch.equal(out[:, :7], prompts)
    for row in out:
        for t in range(7, 12):
            assert int(dec.forward_dense(row[:t])[-1].argmax()) == int(row[t])
    logits, _ = forward_batch(dec, out)
    torch.testing.assert_close(logits[1], dec.forward_dense(out[1]), atol=1e-4, rtol=1e-4)


def test_training_raises_acceptance_on_the_training_text(dec):
    g = torch.Generator().manual_seed(1)
    seqs = generate_greedy(dec, torch.randint(1, dec.shape.vocab, (8, 4), generator=g), 12)
    aux, last = features(dec, seqs)
    head0 = DraftHead(dec.shape, init_head(dec, 64, seed=0), dec.embed, dec.lm_head)
    w = train_head(dec, seqs, aux, last, steps=150, batch=64, lr=3e-3, mlp_hidden=64, log=lambda m: None)
    head = DraftHead(dec.shape, w, dec.embed, dec.lm_head)
    a0, a1 = acceptance(dec, head0, seqs)["acceptance"], acceptance(dec, head, seqs)["acceptance"]
    assert a1 > a0 + 0.2, (a0, a1)
    # propose is the argmax of the shared forward over the target's LM head (no draft vocabulary of its own; the
    # tiny model's LM head is not its embedding, so this also checks which one the head uses)
    assert not dec.shape.tie_embeddings
    x = torch.randn(5, 3 * dec.shape.hidden)
    tok = torch.arange(5)
    assert torch.equal(head.propose(x, tok), draft_logits(w, dec.shape, x, dec.embed[tok], dec.lm_head).argmax(-1))


def test_the_committed_smollm2_head_loads():
    if not os.path.isfile(os.path.join(HEAD, "model.safetensors")):
        pytest.skip("no trained head in this checkout")
    from oasis_exec.model.gguf import smollm2_path

    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    from oasis_exec.model.gguf import read_gguf

    spec = read_gguf(path).spec
    embed = torch.zeros(spec.vocab, spec.hidden)
    head = DraftHead.build(spec, embed, path=HEAD, dtype=torch.float32)
    assert not head.own_head and head.layers == (2, 15, 27)
    assert head.propose(torch.randn(2, 3 * spec.hidden), torch.tensor([1, 2])).shape == (2,)
