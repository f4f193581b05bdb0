"""An EAGLE-3-style draft head in the published weight layout (as EAGLE-3 checkpoints and vLLM's
``llama_eagle3`` name them):

- ``fc.weight`` [hidden, 3 * target_hidden]: fuses the target's low / mid / high hidden states;
- ``midlayer.*``: one decoder layer whose q/k/v projections take ``2 * hidden`` inputs (the normed token embedding
  ``input_layernorm`` concatenated with the normed fused features ``hidden_norm``), then ``post_attention_layernorm``
  and a SwiGLU MLP;
- ``norm.weight``, ``lm_head.weight`` [draft_vocab, hidden], ``d2t`` [draft_vocab] (target id = draft id +
  d2t[draft id]) and ``t2d`` [vocab] (bool: target ids inside the draft vocabulary). The token embedding is the
  target's.

At the end of a step (token x_t just sampled) the head reads the target's features at the previous position and
x_t's embedding and proposes d_{t+1}, a guess of the token after x_t. The next decode step stacks the real token
x_t and the draft token d_{t+1} (at the following position); the draft token's queries predict the blocks that the
step after will need.

Simplification (documented): the draft layer attends only to its own current position (no draft KV cache over
past positions); with single-key attention the output is the value projection, so ``q_proj``/``k_proj`` are never
read (a checkpoint may omit them). Heads trained here (``oasis_exec.tools.draft_train``) are trained with exactly this
forward (``draft_logits``); a published EAGLE-3 checkpoint keeps its weights but loses its attention over past
positions.

A checkpoint without ``lm_head.weight`` (and ``d2t``) uses the target's own LM head over the full vocabulary, as
EAGLE-1 did; the SmolLM2 head in ``experiments/trained_draft_head/`` is of that kind (a third of the size).
"""

from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F

from oasis_core.specs import ModelSpec

from .decoder import rms_norm

NAMES = (
    "fc.weight",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight",
    "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
    "norm.weight",
)  # required; lm_head.weight + d2t optional (module doc)


def aux_layers(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default feature layers: low, middle and high."""
    return (min(2, n_layers - 1), n_layers // 2, max(n_layers - 3, 0))


def random_draft_weights(shape: ModelSpec, draft_vocab: int, seed: int = 1, dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator(device=device).manual_seed(seed)
    h, d = shape.hidden, shape.head_dim

    def mat(r, c):
        return (torch.randn(r, c, generator=g, device=device) / math.sqrt(c)).to(dtype)

    w = {
        "fc.weight": mat(h, 3 * h),
        "midlayer.self_attn.q_proj.weight": mat(shape.n_q_heads * d, 2 * h),
        "midlayer.self_attn.k_proj.weight": mat(shape.n_kv_heads * d, 2 * h),
        "midlayer.self_attn.v_proj.weight": mat(shape.n_kv_heads * d, 2 * h),
        "midlayer.self_attn.o_proj.weight": mat(h, shape.n_q_heads * d),
        "midlayer.mlp.gate_proj.weight": mat(shape.mlp_hidden, h),
        "midlayer.mlp.up_proj.weight": mat(shape.mlp_hidden, h),
        "midlayer.mlp.down_proj.weight": mat(h, shape.mlp_hidden),
        "lm_head.weight": mat(draft_vocab, h),
    }
    for n in (
        "midlayer.input_layernorm.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.post_attention_layernorm.weight",
        "norm.weight",
    ):
        w[n] = torch.ones(h, dtype=dtype, device=device)
    # Draft vocabulary = a seeded subset of the target's, sorted; d2t stores offsets as EAGLE-3 does.
    ids = torch.randperm(shape.vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    w["d2t"] = (ids - torch.arange(draft_vocab)).to(device)
    t2d = torch.zeros(shape.vocab, dtype=torch.bool)
    t2d[ids] = True
    w["t2d"] = t2d.to(device)
    return w


def draft_hidden(w: dict, shape: ModelSpec, feats, emb):
    """The head's layer: fused features ``feats`` [B, hidden] (``fc`` of the target's, or the head's own hidden
    state of the previous draft step in a speculative chain) and the embedding ``emb`` [B, hidden] of the token just
    sampled or drafted -> the head's hidden state [B, hidden] before its final norm."""
    eps = shape.rms_eps
    x = torch.cat(
        [
            rms_norm(emb, w["midlayer.input_layernorm.weight"], eps),
            rms_norm(feats, w["midlayer.hidden_norm.weight"], eps),
        ],
        dim=-1,
    )
    # Single-key attention: softmax over one key is 1, so the output is v (expanded over the GQA group).
    v = (x @ w["midlayer.self_attn.v_proj.weight"].t()).view(-1, shape.n_kv_heads, 1, shape.head_dim)
    attn = v.expand(-1, -1, shape.gqa_group, -1).reshape(v.shape[0], -1)
    h = feats + attn @ w["midlayer.self_attn.o_proj.weight"].t()
    y = rms_norm(h, w["midlayer.post_attention_layernorm.weight"], eps)
    return (
        h
        + (F.silu(y @ w["midlayer.mlp.gate_proj.weight"].t()) * (y @ w["midlayer.mlp.up_proj.weight"].t()))
        @ w["midlayer.mlp.down_proj.weight"].t()
    )


def head_logits(w: dict, eps: float, h, lm_head):
    """The head's output: hidden states ``h`` [..., hidden] through its final norm and ``lm_head`` [V', hidden]
    -> logits [..., V'] (float32)."""
    return (rms_norm(h, w["norm.weight"], eps) @ lm_head.t()).float()


def draft_logits(w: dict, shape: ModelSpec, aux, emb, lm_head):
    """The head's forward, differentiable (training uses it as is): aux [B, 3 * hidden] target features, emb
    [B, hidden] the embedding of the token just sampled, lm_head [V', hidden] -> logits [B, V'] (float32)."""
    h = draft_hidden(w, shape, aux @ w["fc.weight"].t(), emb)
    return head_logits(w, shape.rms_eps, h, lm_head)


class DraftHead:
    def __init__(self, shape: ModelSpec, weights: dict, embed, lm_head=None):
        """embed: the target's token embedding; lm_head: the target's LM head, used when the checkpoint has none
        (default: ``embed``, i.e. tied embeddings)."""
        missing = [n for n in NAMES if n not in weights]
        if missing:
            raise KeyError(f"draft checkpoint lacks {missing[0]} (and {len(missing) - 1} more)")
        if ("lm_head.weight" in weights) != ("d2t" in weights):
            raise KeyError("draft checkpoint: lm_head.weight and d2t come together (neither = the target's LM head)")
        self.shape, self.w, self.embed = shape, weights, embed
        self.own_head = "lm_head.weight" in weights
        self.lm_head = weights["lm_head.weight"] if self.own_head else (embed if lm_head is None else lm_head)
        self.d2t = weights["d2t"].long() if self.own_head else None
        self.layers = aux_layers(shape.n_layers)
        self.want_conf = False  # Drafts sets it (ExecConfig.draft_gate): _ids then keeps each draft's probability
        self.conf = None  # [B] fp32: the head's probability of each draft it last proposed (when want_conf)

    @staticmethod
    def build(shape, embed, path=None, draft_vocab=None, seed=1, dtype=torch.bfloat16, device="cpu", lm_head=None):
        if path is None:
            dv = draft_vocab or min(shape.vocab, 32000)
            return DraftHead(shape, random_draft_weights(shape, dv, seed, dtype, device), embed, lm_head)
        from .decoder import load_safetensors_dir

        w = load_safetensors_dir(path, dtype, device)
        return DraftHead(shape, w, embed, lm_head)

    def save(self, path: str, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        cfg = {
            "architectures": ["LlamaForCausalLMEagle3"],
            "draft_vocab_size": int(self.lm_head.shape[0]),
            "target_lm_head": not self.own_head,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.layers)},
            **(extra or {}),
        }
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(cfg, fh, indent=1)
        save_file({k: v.contiguous().cpu() for k, v in self.w.items()}, os.path.join(path, "model.safetensors"))

    def logits(self, aux, token_ids):
        """Draft logits [B, V'] over the draft vocabulary (the target's when the head has none of its own)."""
        return draft_logits(self.w, self.shape, aux, self.embed[token_ids], self.lm_head)

    def propose(self, aux, token_ids):
        """aux: [B, 3 * hidden] target features; token_ids: [B] the tokens just sampled -> draft ids [B] (target
        vocabulary), greedy."""
        return self.propose_state(aux, token_ids)[0]

    def _ids(self, h):
        logits = head_logits(self.w, self.shape.rms_eps, h, self.lm_head)
        top, d = logits.max(-1)
        if self.want_conf:  # the draft's probability under the head: exp(its logit - logsumexp)
            self.conf = torch.exp(top - torch.logsumexp(logits, -1))
        return d + self.d2t[d] if self.own_head else d

    def top_ids(self, h, n: int, with_prob: bool = False):
        """The head's ``n`` best tokens [..., n], best first (``_ids``'s first column; no confidence kept). With
        ``with_prob``: (ids, their probabilities [..., n] under the head, ``exp(logit - logsumexp)`` as ``_ids``
        keeps the first), from the one logits computation."""
        logits = head_logits(self.w, self.shape.rms_eps, h, self.lm_head)
        top = logits.topk(n, -1)
        d = top.indices
        ids = d + self.d2t[d] if self.own_head else d
        if not with_prob:
            return ids
        return ids, torch.exp(top.values - torch.logsumexp(logits, -1, keepdim=True))

    def propose_state(self, aux, token_ids):
        """``propose`` and the head's hidden state [B, hidden] behind it, which a speculative chain feeds on
        (``chain``)."""
        h = draft_hidden(self.w, self.shape, aux @ self.w["fc.weight"].t(), self.embed[token_ids])
        return self._ids(h), h

    def chain(self, h, token_ids):
        """The next draft of a speculative chain, as EAGLE drafts: the head's own hidden state ``h`` [B, hidden] of
        the previous draft step stands in for the fused target features (no ``fc``), ``token_ids`` [B] are the
        drafts it proposed. Returns (draft ids [B], the new hidden state). The heads trained here saw only target
        features, so a chain's later drafts are weaker than its first."""
        h = draft_hidden(self.w, self.shape, h, self.embed[token_ids])
        return self._ids(h), h
