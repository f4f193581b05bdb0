"""The full EAGLE-3 draft layer: attention over its own K/V of every earlier position (``--draft-head attn``).

Layout (EAGLE-3 as published, e.g. vllm-project/speculators ``Eagle3DecoderLayer``, ``norm_before_residual``
false): per position p, ``fused_p = fc(aux_p)`` (the target's residuals after the low / mid / high ``aux_layers``
at p, concatenated), ``x_p = [input_layernorm(embed(tok_{p+1})); hidden_norm(fused_p)]`` (2 * hidden),
q/k/v = projections of ``x_p`` with RoPE at position p, causal attention of q_p over the draft layer's own keys of
positions 0..p, ``h = fused_p + o_proj(attn)``, ``h += mlp(post_attention_layernorm(h))``, logits =
``lm_head(norm(h))``: the guess of ``tok_{p+2}``. Weight names are ``oasis_exec.draft``'s plus ``q_proj`` and
``k_proj`` (read here, unlike the single-key head's). The layer's own attention shape (heads, KV heads, head dim,
RoPE base) defaults to the target's and is stored in the checkpoint's ``config.json`` under ``draft_attention``.

**Where its K/V lives.** ``DraftKV``: one buffer per lane on the GPU, whole ([max_lanes, max_context, Hkv, D] for k
and v, the head's dtype), not behind the sparse view: it is one layer's worth of KV, 1 / n_layers of the target's
dense cache (SmolLM2-135M: 3 KV heads x 64 x 2 (k, v) x 2 bytes = 768 bytes a position = 6.3 MB a lane at 8K;
Gemma 3 270M with its own shape: 1 x 256 x 2 x 2 = 1 KiB a position = 32 MiB a lane at 32K). Each decode step
writes one position a lane and attends the lane's positions so far in place (``DraftKV.attend``: on CUDA the ring
kernel over the buffer, which loads only the positions up to the query's; no host synchronisation, so the step is
capturable): at most ``DraftKV.bytes_per_step(B)`` read a step. Until 2026-12-06 the step gathered the lanes' whole
buffers and cast them to fp32 before two einsums (now the CPU path only): on the H100 at SmolLM2's 7,800 tokens x
64 lanes that made a lookahead step 7.0 ms against 4.2 ms with the single-key head
(``experiments/speculative_decoding``, "The long-context heads in the engine").

**When it is written.** At prefill (``prefill_chunk``, every chunk): positions ``start .. end - 2`` of the chunk
from the target's features there and the next prompt token; the chunk's last features wait in ``pending`` for the
next chunk's first token. The last prompt position is written by the prefill's proposal (its sampled token), and
each decode step appends the step's real position (``propose_lanes``). A lane's positions are therefore written in
order, each once, and ``n[lane]`` (the lane's length, on the device) is both the next position and the count;
the runner proposes for every lane every step when the head attends (``attends``), short steps included.

**Speculative decoding at k = 1** (``propose_accepted``). The step's one draft is the head's last proposal (no
chain); the verify pass gives the target's features at the step's two positions ``p`` and ``p + 1``, and after the
acceptance (``n`` in {0, 1} accepted drafts a lane) the head writes positions ``p .. p + n`` from them and the
emitted tokens (teacher-forced on the target, as an ordinary step writes ``p``) and proposes from the last: 1 or 2
positions a lane a step, on the device (each position's write masked to the accepted run, so a rejected draft's
position never enters the K/V and nothing is rolled back; capturable).

Not supported: speculative chains (k >= 2; ``ExecConfig`` refuses them with this head): a chain's later drafts
would need the head run on its own outputs (its hidden state standing in for the target's features, its drafted
positions' K/V written and rolled back), which it was not trained for (it saw the target's features only);
``chain`` raises.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from oasis_core.specs import ModelSpec

from .. import ops
from .decoder import rms_norm, rope
from .draft import NAMES, DraftHead, head_logits, random_draft_weights

ATTN_NAMES = NAMES + ("midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight")
HEAD_KINDS = ("single", "attn")  # ExecConfig.draft_head


@dataclass(frozen=True)
class AttnShape:
    """The draft layer's attention: query heads, KV heads, head dim, RoPE base."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_theta: float

    @staticmethod
    def of(shape: ModelSpec) -> "AttnShape":
        return AttnShape(shape.n_q_heads, shape.n_kv_heads, shape.head_dim, float(shape.rope_theta))

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


def layer_input(w: dict, eps: float, fused, emb):
    """[input_layernorm(emb); hidden_norm(fused)]: [..., 2 * hidden]."""
    return torch.cat(
        [
            rms_norm(emb, w["midlayer.input_layernorm.weight"], eps),
            rms_norm(fused, w["midlayer.hidden_norm.weight"], eps),
        ],
        -1,
    )


def project_qkv(w: dict, a: AttnShape, x, pos):
    """x [..., 2h], pos int64 [...] -> q [..., Hq, D], k, v [..., Hkv, D] (RoPE on q and k)."""
    lead = x.shape[:-1]
    q = (x @ w["midlayer.self_attn.q_proj.weight"].t()).view(*lead, a.n_heads, a.head_dim)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].t()).view(*lead, a.n_kv_heads, a.head_dim)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].t()).view(*lead, a.n_kv_heads, a.head_dim)
    return rope(q, pos, a.rope_theta), rope(k, pos, a.rope_theta), v


def layer_output(w: dict, eps: float, fused, attn):
    """fused [..., h], attn [..., Hq * D] -> the layer's hidden state [..., h] (before the final norm)."""
    h = fused + attn @ w["midlayer.self_attn.o_proj.weight"].t()
    y = rms_norm(h, w["midlayer.post_attention_layernorm.weight"], eps)
    gate = y @ w["midlayer.mlp.gate_proj.weight"].t()
    return h + (F.silu(gate) * (y @ w["midlayer.mlp.up_proj.weight"].t())) @ w["midlayer.mlp.down_proj.weight"].t()


def hidden_seq(w: dict, a: AttnShape, eps: float, aux, emb, pos0: int = 0):
    """The layer over whole sequences, causal (training, the reference of the incremental path): aux [B, T, 3h]
    features at positions pos0.., emb [B, T, h] the embeddings of the tokens one position later -> [B, T, h]."""
    B, T, _ = aux.shape
    fused = aux @ w["fc.weight"].t()
    pos = torch.arange(pos0, pos0 + T, device=aux.device).expand(B, T)
    q, k, v = project_qkv(w, a, layer_input(w, eps, fused, emb), pos)
    o = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2).repeat_interleave(a.group, 1),
        v.transpose(1, 2).repeat_interleave(a.group, 1),
        is_causal=True,
    )
    return layer_output(w, eps, fused, o.transpose(1, 2).reshape(B, T, -1))


def logits_seq(w: dict, a: AttnShape, eps: float, aux, emb, lm_head, pos0: int = 0):
    """``hidden_seq`` -> logits [B, T, V'] (float32)."""
    return head_logits(w, eps, hidden_seq(w, a, eps, aux, emb, pos0), lm_head)


class DraftKV:
    """The draft layer's K/V of every lane: k, v [max_lanes, max_len, Hkv, D] on the head's device, whole; ``n``
    int64 [max_lanes]: positions written (the next one to write)."""

    def __init__(self, a: AttnShape, max_lanes: int, max_len: int, dtype, device):
        self.a, self.max_len = a, max_len
        self.k = torch.zeros(max_lanes, max_len, a.n_kv_heads, a.head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.n = torch.zeros(max_lanes, dtype=torch.int64, device=device)

    @property
    def bytes_per_lane(self) -> int:
        return 2 * self.k[0].numel() * self.k.element_size()

    def attend(self, q, lanes, pos):
        """Queries ``q`` [B, Hq, D] at positions ``pos`` [B] over rows ``lanes`` [B], causal (positions 0 .. pos) ->
        [B, Hq, D] in q's dtype. The buffer is read in place as a ring of ``max_len`` slots whose window is the whole
        ring (``oasis_exec.ops.ring_attn``: on CUDA, where its tiles fit the head dim, the Triton kernel
        ``oasis_kernels.ring_attn``, which reads only the live positions; elsewhere its torch reference, the gather
        and fp32 einsums this head used before): slot i holds position i, seen by a query at p exactly when i <= p.
        Scores, softmax and accumulation in fp32 on both paths."""
        k, v = self.k.transpose(1, 2), self.v.transpose(1, 2)  # [lanes, Hkv, max_len, D] views, D contiguous
        return ops.ring_attn(q[:, None], k, v, lanes, pos[:, None], self.max_len)[:, 0]

    def bytes_per_step(self, lanes: int) -> int:
        """Bytes a decode step reads (at most each lane's whole buffer: the kernel loads only the positions up to each
        lane's query) and writes (one position a lane)."""
        per_pos = 2 * self.a.n_kv_heads * self.a.head_dim * self.k.element_size()
        return lanes * (self.max_len + 1) * per_pos


class AttnDraftHead(DraftHead):
    """``DraftHead`` with the EAGLE-3 layer's attention over its own K/V (module doc). ``propose``/``logits`` of a
    single position are not defined for it (they need the lane's earlier positions): the engine calls
    ``prefill_chunk`` and ``propose_lanes``; training and analysis call ``logits_seq``."""

    attends = True

    def __init__(
        self,
        shape: ModelSpec,
        weights: dict,
        embed,
        lm_head=None,
        attn: AttnShape | None = None,
        max_lanes: int = 1,
        max_len: int = 4096,
    ):
        missing = [n for n in ATTN_NAMES if n not in weights]
        if missing:
            raise KeyError(f"attention draft checkpoint lacks {missing[0]} (and {len(missing) - 1} more)")
        super().__init__(shape, weights, embed, lm_head)
        self.attn = attn or AttnShape.of(shape)
        self.max_len = max_len
        self.kv = self.pending = None
        if max_lanes:
            self.allocate(max_lanes)

    def allocate(self, max_lanes: int, max_len: int | None = None) -> None:
        """The K/V of ``max_lanes`` lanes of ``max_len`` positions (default: the build's) on the weights' device."""
        self.max_len = max_len or self.max_len
        w0 = self.w["midlayer.self_attn.q_proj.weight"]
        self.kv = DraftKV(self.attn, max_lanes, self.max_len, w0.dtype, w0.device)
        self.pending = torch.zeros(max_lanes, 3 * self.shape.hidden, dtype=w0.dtype, device=w0.device)

    @staticmethod
    def build(
        shape,
        embed,
        path=None,
        draft_vocab=None,
        seed=1,
        dtype=torch.bfloat16,
        device="cpu",
        lm_head=None,
        max_lanes: int = 1,
        max_len: int = 4096,
    ):
        """A random head (``path`` None) or a checkpoint directory (its ``config.json``'s ``draft_attention``)."""
        attn = None
        if path is None:
            w = random_draft_weights(shape, draft_vocab or min(shape.vocab, 32000), seed, dtype, device)
        else:
            from .decoder import load_safetensors_dir

            w = load_safetensors_dir(path, dtype, device)
            cfg_file = os.path.join(path, "config.json")
            if os.path.isfile(cfg_file):
                with open(cfg_file) as fh:
                    da = json.load(fh).get("draft_attention")
                attn = AttnShape(**da) if da else None
        return AttnDraftHead(shape, w, embed, lm_head, attn, max_lanes, max_len)

    def save(self, path: str, extra: dict | None = None) -> None:
        super().save(path, {"draft_attention": asdict(self.attn), "draft_head": "attn", **(extra or {})})

    # -- the engine's calls -------------------------------------------------------------------------------------------

    def reset(self, lane: int) -> None:
        self.kv.n[lane] = 0

    def _write(self, lanes, aux, tok, pos):
        """Writes positions ``pos`` [B] of ``lanes`` [B] from features ``aux`` [B, 3h] and the next tokens ``tok``
        [B]; returns (fused [B, h], q [B, Hq, D])."""
        w, a, eps = self.w, self.attn, self.shape.rms_eps
        fused = aux.to(w["fc.weight"].dtype) @ w["fc.weight"].t()
        q, k, v = project_qkv(w, a, layer_input(w, eps, fused, self.embed[tok]), pos)
        self.kv.k[lanes, pos] = k.to(self.kv.k.dtype)
        self.kv.v[lanes, pos] = v.to(self.kv.v.dtype)
        return fused, q

    @torch.no_grad()
    def prefill_chunk(self, lane: int, start: int, aux, tokens) -> None:
        """A prefill chunk of ``lane``: features ``aux`` [n, 3h] at positions ``start .. start + n - 1`` and the
        chunk's tokens ``tokens`` [n] (at the same positions). Writes positions ``start - 1 .. start + n - 2``."""
        dev = self.kv.k.device
        tokens = torch.as_tensor(tokens, device=dev).long()
        n = aux.shape[0]
        if start == 0:
            self.reset(lane)
            feats, nxt, pos0 = aux[:-1], tokens[1:], 0
        else:
            feats = torch.cat([self.pending[lane][None], aux[:-1].to(self.pending.dtype)])
            nxt, pos0 = tokens, start - 1
        m = feats.shape[0]
        if m:
            pos = torch.arange(pos0, pos0 + m, device=dev)
            self._write(torch.full((m,), lane, device=dev), feats, nxt, pos)
        self.kv.n[lane] = start + n - 1
        self.pending[lane] = aux[-1].to(self.pending.dtype)

    def propose_lanes(self, lanes, aux, tok):
        """One decode step of ``lanes`` [B] (tensor or list): features ``aux`` [B, 3h] at each lane's next position
        ``n[lane]`` and the tokens ``tok`` [B] sampled there -> draft ids [B] (target vocabulary), greedy. Appends
        the position to each lane's K/V."""
        return self._ids(self.step_hidden(lanes, aux, tok))

    @torch.no_grad()
    def step_hidden(self, lanes, aux, tok):
        """``propose_lanes`` up to the layer's hidden state [B, hidden] (before the final norm)."""
        lanes = torch.as_tensor(lanes, device=self.kv.k.device).long()
        tok = torch.as_tensor(tok, device=self.kv.k.device).long().reshape(-1)
        kv = self.kv
        pos = kv.n[lanes]
        fused, q = self._write(lanes, aux, tok, pos)
        kv.n[lanes] = pos + 1
        return self._attend(lanes, fused, q, pos)

    def _attend(self, lanes, fused, q, pos):
        """The layer's hidden state [B, hidden] of queries ``q`` [B, Hq, D] at positions ``pos`` [B] over each lane's
        K/V of positions 0 .. pos (``fused`` [B, hidden]: their fused features)."""
        o = self.kv.attend(q, lanes, pos)
        return layer_output(self.w, self.shape.rms_eps, fused, o.reshape(q.shape[0], -1).to(fused.dtype))

    def propose_accepted(self, lanes, aux, tok, acc):
        """After a speculative step (module doc): features ``aux`` [B, T, 3h] of the verify pass at each lane's
        positions ``n[lane] .. n[lane] + T - 1`` (``T = k + 1``), the tokens ``tok`` [B, T] emitted at the positions
        after them (a row's first ``acc + 1`` count) and ``acc`` [B] int64, the drafts each lane accepted (on the
        device). Appends positions ``n[lane] .. n[lane] + acc`` to each lane's K/V (the rest never written) and
        returns the draft ids [B] proposed from the last: what ``propose_lanes`` of each accepted position in turn
        would give, with no host synchronisation."""
        return self._ids(self.accepted_hidden(lanes, aux, tok, acc))

    @torch.no_grad()
    def accepted_hidden(self, lanes, aux, tok, acc):
        """``propose_accepted`` up to the layer's hidden state [B, hidden] of each lane's last accepted position."""
        dev = self.kv.k.device
        lanes = torch.as_tensor(lanes, device=dev).long()
        tok = torch.as_tensor(tok, device=dev).long()
        acc = torch.as_tensor(acc, device=dev).long()
        kv, T = self.kv, aux.shape[1]
        w, a, eps = self.w, self.attn, self.shape.rms_eps
        pos0 = kv.n[lanes]
        pos = pos0[:, None] + torch.arange(T, device=dev)  # [B, T]
        fused = aux.to(w["fc.weight"].dtype) @ w["fc.weight"].t()  # [B, T, h]
        q, k, v = project_qkv(w, a, layer_input(w, eps, fused, self.embed[tok]), pos)
        last = kv.max_len - 1
        for j in range(T):  # one position a lane a write: no index repeats within it
            keep = (acc >= j)[:, None, None]  # position j is the accepted run's (j = 0 always)
            pj = pos[:, j].clamp(max=last)  # a position past the buffer is never kept (it writes back what it read)
            kv.k[lanes, pj] = torch.where(keep, k[:, j].to(kv.k.dtype), kv.k[lanes, pj])
            kv.v[lanes, pj] = torch.where(keep, v[:, j].to(kv.v.dtype), kv.v[lanes, pj])
        kv.n[lanes] = pos0 + acc + 1
        ar = torch.arange(lanes.shape[0], device=dev)
        return self._attend(lanes, fused[ar, acc], q[ar, acc], pos0 + acc)

    def synthesize(self, lane: int, n_pos: int, seed: int = 0) -> None:
        """Benchmarks with a synthesized prompt: positions 0..n_pos-1 of ``lane`` filled with seeded random K/V."""
        g = torch.Generator(device=self.kv.k.device).manual_seed(seed)
        shp = (n_pos, self.attn.n_kv_heads, self.attn.head_dim)
        for buf in (self.kv.k, self.kv.v):
            buf[lane, :n_pos] = torch.randn(shp, generator=g, device=buf.device).to(buf.dtype)
        self.kv.n[lane] = n_pos

    # -- what this head does not do --------------------------------------------------------------------------------

    def logits(self, aux, token_ids):
        raise NotImplementedError("AttnDraftHead: one position's logits need its lane's K/V; use logits_seq")

    def propose(self, aux, token_ids):
        raise NotImplementedError("AttnDraftHead: use propose_lanes (the lanes' K/V) or logits_seq")

    def propose_state(self, aux, token_ids):
        raise NotImplementedError(
            "AttnDraftHead: speculative chains (k >= 2) are not supported (ExecConfig refuses them); k = 1 proposes "
            "with propose_accepted"
        )

    def chain(self, h, token_ids):
        raise NotImplementedError(
            "AttnDraftHead: speculative chains (k >= 2) are not supported: the head is trained on the target's "
            "features only, never on its own outputs (ExecConfig refuses them)"
        )


def saved_kind(path: str) -> str:
    """The kind of the head saved at ``path``: its ``config.json``'s ``draft_head`` (an attention head also names its
    ``draft_attention``); ``single`` where it says neither (EAGLE-3 checkpoints)."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_file):
        return "single"
    with open(cfg_file) as fh:
        cfg = json.load(fh)
    return cfg.get("draft_head") or ("attn" if cfg.get("draft_attention") else "single")


def build_draft(kind: str, shape, embed, path, draft_vocab, seed, dtype, device, lm_head, max_len):
    """The engine's draft head of ``kind`` (``HEAD_KINDS``): today's single-key head or the attention head (its K/V
    of ``max_len`` positions a lane allocated by ``allocate``, once the lanes are known: ``ModelExec``). A head
    directory of the other kind is refused (its weights would load into the wrong layer)."""
    got = saved_kind(path) if path is not None else kind
    if kind in HEAD_KINDS and got != kind:
        raise ValueError(
            f"draft head {path}: its config.json says draft_head {got!r}, the engine asked for {kind!r} "
            f"(set draft_head={got}, --draft-head {got})"
        )
    if kind == "single":
        return DraftHead.build(shape, embed, path, draft_vocab, seed, dtype, device, lm_head=lm_head)
    if kind == "attn":
        return AttnDraftHead.build(shape, embed, path, draft_vocab, seed, dtype, device, lm_head, 0, max_len)
    raise ValueError(f"draft head {kind!r}: choose from {', '.join(HEAD_KINDS)}")
