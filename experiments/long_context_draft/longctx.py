"""What the long-context draft's training and acceptance scripts share: the target (transformers, loaded from the
GGUF: the features the draft reads and the distribution it learns), long sequences of real text, the target's own
long continuations, and the two draft heads' forward over whole sequences.

Features: per position p, ``aux_p`` = the residuals after the target's ``aux_layers`` (transformers'
``hidden_states[i + 1]``: the output of decoder layer i, before the final norm) concatenated, and ``hn_p`` = the
final normed hidden state, from which ``Target.logits`` gives the target's logits at p. Entry p of a draft reads
(``aux_p``, token p + 1) and predicts token p + 2: its target is the target's distribution at p + 1.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from oasis_core.specs import ModelSpec
from oasis_exec.model.decoder import rms_norm
from oasis_exec.model.draft import DraftHead, aux_layers, draft_logits
from oasis_exec.model.draft_attn import AttnDraftHead, AttnShape, hidden_seq

BUCKETS = ((0, 1024), (1024, 2048), (2048, 4096), (4096, 8192), (8192, 16384), (16384, 32768))


def bucket_name(lo: int, hi: int) -> str:
    return f"{lo // 1024}-{hi // 1024}K"


class Target:
    """A causal LM from a GGUF file (or a Hugging Face directory) through transformers, frozen."""

    def __init__(self, path: str, device="cpu", dtype=torch.bfloat16):
        from transformers import AutoModelForCausalLM

        kw = {"dtype": dtype, "attn_implementation": "sdpa"}
        if str(path).endswith(".gguf"):
            d, f = os.path.split(os.path.abspath(path))
            self.model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, **kw)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(path, **kw)
        self.model.to(device).eval().requires_grad_(False)
        self.path, self.device, self.dtype = path, torch.device(device), dtype
        c = self.model.config
        self.cfg = c
        self.n_layers = c.num_hidden_layers
        self.layers = aux_layers(self.n_layers)
        self.embed = self.model.get_input_embeddings().weight  # the draft's token input (its RMSNorm drops a scale)
        self.lm_head = self.model.get_output_embeddings().weight
        self.softcap = getattr(c, "final_logit_softcapping", None)
        self.max_positions = int(getattr(c, "max_position_embeddings", 8192))
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.spec = ModelSpec(
            name="target",
            n_layers=self.n_layers,
            n_q_heads=c.num_attention_heads,
            n_kv_heads=c.num_key_value_heads,
            head_dim=hd,
            hidden=c.hidden_size,
            mlp_hidden=c.intermediate_size,
            vocab=self.embed.shape[0],
            max_context_tokens=self.max_positions,
            rms_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
            tie_embeddings=True,
        )

    def logits(self, hn):
        """hn [..., hidden] final normed hidden states -> logits [..., V] (float32)."""
        z = (hn.to(self.lm_head.dtype) @ self.lm_head.t()).float()
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z

    @torch.inference_mode()
    def features(self, tokens):
        """tokens [B, T] -> (aux [B, T, 3h], hn [B, T, h]) in the target's dtype."""
        out = self.model.model(torch.as_tensor(tokens, device=self.device), output_hidden_states=True)
        hs = out.hidden_states
        return torch.cat([hs[i + 1] for i in self.layers], -1), out.last_hidden_state

    @torch.inference_mode()
    def generate(self, prefix, n_new: int, temperature: float = 0.0, seed: int = 0):
        """The target's own continuation of prefix [B, P] for ``n_new`` tokens (greedy, or sampled at
        ``temperature``) -> [B, P + n_new]."""
        torch.manual_seed(seed)
        prefix = torch.as_tensor(prefix, device=self.device)
        kw = {"do_sample": temperature > 0, "max_new_tokens": n_new, "min_new_tokens": n_new}
        if temperature > 0:
            kw.update(temperature=temperature, top_k=0, top_p=1.0)
        out = self.model.generate(
            prefix, attention_mask=torch.ones_like(prefix), pad_token_id=0, eos_token_id=None, **kw
        )
        return out[:, : prefix.shape[1] + n_new]


# -- the heads over whole sequences ----------------------------------------------------------------------------------


def head_hidden(head: DraftHead, spec: ModelSpec, aux, nxt_emb):
    """The head's hidden states [B, T, h] for entries (aux [B, T, 3h], embeddings of tokens one later [B, T, h])."""
    if getattr(head, "attends", False):
        return hidden_seq(head.w, head.attn, spec.rms_eps, aux, nxt_emb)
    from oasis_exec.model.draft import draft_hidden

    return draft_hidden(
        head.w, spec, aux.reshape(-1, aux.shape[-1]) @ head.w["fc.weight"].t(), nxt_emb.reshape(-1, nxt_emb.shape[-1])
    ).view(aux.shape[0], aux.shape[1], -1)


def train_logits(w: dict, kind: str, attn: AttnShape | None, spec: ModelSpec, aux, nxt_emb, pick, lm_head):
    """Training forward: logits [len(pick), V] of the entries ``pick`` (flat indices into B * T) of sequences
    aux [B, T, 3h] (the single-key head runs only the picked entries; the attention head runs every entry, causal)."""
    B, T, _ = aux.shape
    if kind == "attn":
        h = hidden_seq(w, attn, spec.rms_eps, aux, nxt_emb).reshape(B * T, -1)[pick]
        return (rms_norm(h, w["norm.weight"], spec.rms_eps) @ lm_head.t()).float()
    return draft_logits(w, spec, aux.reshape(B * T, -1)[pick], nxt_emb.reshape(B * T, -1)[pick], lm_head)


def load_head(path: str, spec: ModelSpec, target: Target, dtype, device, max_len: int):
    """A head directory of either kind (``config.json``'s ``draft_head``; absent: the single-key head)."""
    import json

    with open(os.path.join(path, "config.json")) as fh:
        kind = json.load(fh).get("draft_head", "single")
    if kind == "attn":
        return AttnDraftHead.build(spec, target.embed, path, dtype=dtype, device=device, lm_head=target.lm_head)
    return DraftHead.build(spec, target.embed, path, dtype=dtype, device=device, lm_head=target.lm_head)


# -- data -------------------------------------------------------------------------------------------------------------


def load_data(path: str) -> dict:
    """The ``corpus`` file: {"train": [N, T], "held": [M, T], "text:<name>": [n]} as int64 numpy arrays."""
    z = np.load(path)
    return {k: z[k].astype(np.int64) for k in z.files if not k.endswith("_files")} | {
        k: z[k] for k in z.files if k.endswith("_files")
    }
