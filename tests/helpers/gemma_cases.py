"""What the Gemma 3 tests share: a tiny random Gemma-shaped model (hybrid: sliding and full layers), its executor
config, and a greedy reference from ``Gemma3Decoder.forward`` (the plain path with each layer's window)."""

import torch

from oasis_core.specs import ModelSpec
from oasis_exec.config import ExecConfig
from oasis_exec.model.gemma3 import Gemma3Arch, Gemma3Decoder, random_weights

WINDOW = 40  # tokens: not a multiple of the block size, shorter than the prompts
TINY_GEMMA = ModelSpec(
    name="tiny-gemma3",
    n_layers=4,
    n_q_heads=4,
    n_kv_heads=2,
    head_dim=32,
    hidden=64,
    mlp_hidden=128,
    vocab=256,
    max_context_tokens=512,
    qk_norm=True,
    rope_theta=1e6,
    rms_eps=1e-6,
    tie_embeddings=True,
    layer_windows=(WINDOW, None, WINDOW, None),
    sliding_rope_theta=1e4,
)
ARCH = Gemma3Arch(query_pre_attn_scalar=24)  # != head_dim: the q scale is exercised


def tiny_decoder(dtype=torch.float32, seed=0):
    return Gemma3Decoder(TINY_GEMMA, ARCH, random_weights(TINY_GEMMA, seed, dtype), dtype)


def cfg(mode, **kw):
    base = dict(
        model="tiny",
        device="cpu",
        dtype="float32",
        mode=mode,
        top_k=8,
        max_context=256,
        max_lanes=3,
        block_size=16,
        draft_vocab=64,
        prefill_chunk=48,
        decode_chain=1,
        spec_chain=1,
    )
    base.update(kw)
    return ExecConfig(**base)


def prompts(seed=0, lens=(70, 33, 100)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 250, (n,), generator=g).tolist() for n in lens]


@torch.no_grad()
def greedy_ref(dec, ids, n):
    """Greedy tokens of the plain forward with a growing cache (the windows applied by masks)."""
    cache = []
    logits = dec.forward(torch.tensor([ids]), cache=cache)[0, -1]
    out = []
    for _ in range(n):
        t = int(logits.argmax())
        out.append(t)
        logits = dec.forward(torch.tensor([[t]]), cache=cache, start=len(ids) + len(out) - 1)[0, -1]
    return out
