"""The working-set interface: what one mode family does on the GPU in a step.

A ``WorkingSet`` is the mode family's side of the layer loop (``ModelExec``): the loop computes q/k/v and the
layer's output; the set decides where the step's K/V go, which blocks attention reads, and what happens to the blocks
around it (fetches, summaries, host copies, the next step's prediction). Per decode step the loop calls:

- ``prepare(s, short, dense_slots, cross)`` once: the per-row tensors every layer reads (``ResidentRows``, or None);
- ``layer(l, s, r, q, k, v)`` for each layer it owns: wait for what the layer needs, write the step's K/V, attend,
  then the work after attention; returns attn [B * nq, Hq, D];
- ``end_step(s)`` once, after the last layer;
- the speculative pass: ``verify_layer`` (every position of a lane as a query) and ``commit`` (after the
  acceptance: what the accepted drafts keep);
- around CUDA-graph capture and replay (``DecodeGraphs``): ``begin_capture``, ``end_capture``, ``before_replay``,
  ``after_replay`` (a set with background copies brackets them; the others do nothing);
- prefill: ``prefill_layer`` (the chunk's K/V in, its causal attention out, the blocks it completed summarised and
  copied), ``prefill_done`` (after the last chunk: the first working set); ``synthesize`` (a benchmark's random
  prefill) and ``release`` (a request that ended mid-prefill).

The families (``FAMILIES`` in ``oasis_exec.workingset``): ``paged`` (dense, quest: the whole KV on the GPU in
pages), ``resident`` (retrieval, proxy, lookahead, the victim cache: the KV in host memory, a bounded set of slots
on the GPU), ``hot_cache`` (hisparse: a resident set whose attention reads the step's top-K among ``hot_slots``), and
``window`` (a hybrid model's sliding-window layers, whatever the mode: a ring of the last W tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SetParts:
    """What a working set works on, built once by ``ModelExec``: the config, the KV store and host pool, the
    prefetcher and fetch caps (resident sets; else None), the ``Selector``, the short-context rule (or None), the
    device and compute dtype, and the block size, KV heads, top-K and layer count."""

    cfg: object
    store: object
    host: object
    pipe: object
    caps: object
    selector: object
    short: object
    device: torch.device
    dtype: torch.dtype
    bs: int
    H: int
    K: int
    L: int


def causal_attn(q, keys, vals, start):
    """A prefill chunk's attention: q [n, Hq, D] at positions start..; keys/vals [H, T, D] (T = start + n) ->
    [n, Hq, D] (fp32 math)."""
    n, Hq, D = q.shape
    H, T, _ = keys.shape
    G = Hq // H
    qh = q.transpose(0, 1).reshape(H, G * n, D)
    mask = torch.arange(T, device=q.device)[None, :] <= (start + torch.arange(n, device=q.device))[:, None]
    mask = mask[None].expand(G, n, T).reshape(G * n, T)
    sc = torch.einsum("hqd,htd->hqt", qh.float(), keys.float()) / math.sqrt(D)
    sc = sc.masked_fill(~mask, -math.inf)
    o = torch.einsum("hqt,htd->hqd", torch.softmax(sc, -1), vals.float())
    return o.reshape(Hq, n, D).transpose(0, 1).to(q.dtype)


class WorkingSet:
    family = ""
    spec_pipe = None  # spec_predict beside (a resident set's workingset.spec_pipeline.SpecPipeline), else None
    draft_conf = None  # ExecConfig.draft_gate: Drafts.conf [lanes], each lane's draft probability, else None

    def __init__(self, parts: SetParts):
        self.p = parts
        self.lane_blocks = {}  # lane -> host block ids (a set that keeps the KV in host memory; else empty)
        self.scratch = {}  # req_id -> a chunked prefill's prompt KV (a set that needs it whole; else empty)

    # -- decode -------------------------------------------------------------------------------------------------

    def prepare(self, s, short="none", dense_slots=None, cross=None):
        return None

    def layer(self, l, s, r, q, k, v):
        raise NotImplementedError

    def end_step(self, s) -> None:
        return None

    # -- speculative decoding --------------------------------------------------------------------------------------

    def prepare_verify(self, s):
        return self.prepare(s)

    def verify_layer(self, l, s, r, q, k, v):
        """A verification pass's layer (every position of a lane is a query row); by default the ordinary layer."""
        return self.layer(l, s, r, q, k, v)

    def commit(self, s, n, sets, recorded) -> None:
        """After the acceptance of a verification pass (``n`` [B] accepted drafts a lane): nothing by default."""
        return None

    # -- CUDA graphs ---------------------------------------------------------------------------------------------

    def begin_capture(self, key) -> None:
        return None

    def end_capture(self, key) -> list:
        """After a capture: the tensors the graph must keep alive."""
        return []

    def after_capture(self, key) -> None:
        return None

    def before_replay(self) -> None:
        return None

    def after_replay(self, key) -> None:
        return None

    def wait_all(self) -> None:
        return None

    # -- prefill and admission -------------------------------------------------------------------------------------

    def admit(self, lane, host_blocks) -> None:
        """A new request on ``lane`` (``host_blocks``: its host blocks, sparse modes): the lane's KV reset."""
        raise NotImplementedError

    def extend(self, lane, blocks) -> bool:
        """Host blocks a lane's request took as it grew; True when they are its first (a short lane crosses)."""
        return False

    def prefill_layer(self, l, ch, q, k, v, pos):
        """Layer ``l`` of a prefill chunk ``ch`` (q [n, Hq, D], k/v [n, H, D] at positions ``pos``): the chunk's
        K/V in, its causal attention [n, Hq, D] out, the blocks it completed summarised (and copied to the host)."""
        raise NotImplementedError

    def prefill_done(self, ch) -> None:
        """After the last chunk of a prefill: the first working set."""
        return None

    def synthesize(self, a, g, layers) -> None:
        """A benchmark's synthesized prefill of admission ``a``: random KV from generator ``g`` in ``layers``."""
        return None

    def release(self, req_id) -> None:
        """Drop what the set holds for a request that ended early (a chunked prefill's prompt KV)."""
        return None
