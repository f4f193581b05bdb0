"""The KV of sliding-window layers (``ModelSpec.layer_windows``): a ring of each lane's last tokens on the GPU.

A sliding layer with window ``W`` attends positions ``p - W + 1 .. p`` from the query at ``p``, so it needs no
pages, host copy, summaries, selection or transfer: ``RingKV`` keeps, per sliding layer, ``k[l]`` / ``v[l]``
``[lanes, H, R, D]`` with ``R = W + extra`` slots; the token at position ``p`` lives in slot ``p % R``. ``extra`` is
the most positions one pass writes past the earliest query it attends for (a speculative step's drafts), so a
pass's newest writes never overwrite a key that one of its own queries still sees.

``attend`` is dense attention over the ring with the window mask computed from the positions on the device (no host
synchronisation; capturable in a CUDA graph): slot ``i`` holds, for a query at ``q``, the position
``q - ((q - i) mod R)``, valid when it is ``>= 0`` and within the window. On CUDA (``kernel``:
``ExecConfig.ring_kernel``) the Triton kernel ``oasis_kernels.ring_attn`` reads the rings in place through ``lanes``
(fp32 scores, softmax and accumulation); elsewhere, or with ``kernel`` off, ``attend_torch`` gathers the lanes' rings
and runs fp32 einsums (the reference). ``prefill`` attends a chunk of a prompt over the ring's earlier tokens and the
chunk itself, then keeps the chunk's last ``R`` tokens.
"""

from __future__ import annotations

import math

import torch

from .. import ops


def ring_extra(cfg) -> int:
    """Slots a ring holds past its window (``cfg``: an ``ExecConfig``): a speculative step's drafts, or the draft row
    of a lookahead step (its KV is written at ``p + 1``; with ``W`` slots it would overwrite position ``p + 1 - W``,
    still in ``p``'s window)."""
    return max(cfg.spec_max_k or 0, 1 if cfg.mode_spec.drafts else 0)


class RingKV:
    def __init__(self, spec, max_lanes: int, extra: int, dtype, device, kernel: bool = True):
        self.kernel = kernel  # CUDA: attend through oasis_kernels.ring_attn (else attend_torch)
        self.windows = {l: spec.layer_window(l) for l in spec.sliding_layers}
        self.H, self.D = spec.n_kv_heads, spec.head_dim
        self.R = {l: w + extra for l, w in self.windows.items()}
        self.k = {l: torch.zeros(max_lanes, self.H, r, self.D, dtype=dtype, device=device) for l, r in self.R.items()}
        self.v = {l: torch.zeros_like(t) for l, t in self.k.items()}

    @staticmethod
    def bytes_per_lane(spec, extra: int, dtype_bytes: int) -> int:
        """GPU bytes of one lane's rings (K and V of every sliding layer)."""
        per_token = 2 * spec.n_kv_heads * spec.head_dim * dtype_bytes
        return sum((spec.layer_window(l) + extra) * per_token for l in spec.sliding_layers)

    def has(self, l: int) -> bool:
        return l in self.windows

    def write(self, l: int, lanes, pos, k, v) -> None:
        """K/V ``[B, n, H, D]`` of positions ``pos`` [B, n] of ``lanes`` [B] (n <= R, distinct slots)."""
        slot = pos % self.R[l]
        lane = lanes[:, None].expand_as(slot)
        self.k[l][lane, :, slot] = k
        self.v[l][lane, :, slot] = v

    def attend(self, l: int, q, lanes, qpos):
        """Queries ``q`` [B, nq, Hq, D] at positions ``qpos`` [B, nq] over the ring (their own K/V already written)
        -> [B, nq, Hq, D]."""
        if self.kernel and q.is_cuda:
            return ops.ring_attn(q, self.k[l], self.v[l], lanes, qpos, self.windows[l])
        return self.attend_torch(l, q, lanes, qpos)

    def attend_torch(self, l: int, q, lanes, qpos):
        """``attend`` in torch (the reference; the CPU path): the lanes' rings gathered, fp32 einsums."""
        R, W = self.R[l], self.windows[l]
        slot = torch.arange(R, device=q.device)
        held = qpos[..., None] - torch.remainder(qpos[..., None] - slot, R)  # [B, nq, R]: position in each slot
        valid = (held >= 0) & (qpos[..., None] - held < W)
        return _attn(q, self.k[l][lanes], self.v[l][lanes], valid)

    def prefill(self, l: int, lane: int, q, k, v, start: int):
        """A prompt chunk of lane ``lane``: q [n, Hq, D], k/v [n, H, D] at positions ``start ..``; attends the ring's
        tokens before ``start`` and the chunk's own, then writes the chunk's last ``R`` tokens. Returns [n, Hq, D]."""
        n, W, R = q.shape[0], self.windows[l], self.R[l]
        dev = q.device
        lo = max(0, start - W + 1)
        old = torch.arange(lo, start, device=dev)
        kpos = torch.cat([old, torch.arange(start, start + n, device=dev)])
        keys = torch.cat([self.k[l][lane][:, old % R], k.transpose(0, 1)], 1)  # [H, T, D]
        vals = torch.cat([self.v[l][lane][:, old % R], v.transpose(0, 1)], 1)
        qpos = torch.arange(start, start + n, device=dev)
        if n <= W:
            valid = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] > qpos[:, None] - W)  # [n, T]
            out = _attn(q[None], keys[None], vals[None], valid[None])[0]
        else:
            out = _banded(q, keys, vals, len(old), W)
        keep = slice(max(0, n - R), n)
        lanes = torch.tensor([lane], device=dev)
        self.write(l, lanes, qpos[None, keep], k[None, keep], v[None, keep])
        return out


def _banded(q, keys, vals, n_old: int, W: int):
    """A chunk longer than the window: q [n, Hq, D] (positions ``start ..``) over keys/vals [H, n_old + n, D] (the
    ring's ``n_old`` tokens before ``start``, then the chunk's), each query over its own window only. The queries go
    in tiles of ``W``; tile ``t`` sees the ``2W - 1`` keys ending at its last query, so the scores are ``n x (2W - 1)``
    instead of ``n x (n_old + n)`` (quadratic in the chunk). -> [n, Hq, D]."""
    n, Hq, D = q.shape
    tiles = -(-n // W)
    front, back = W - 1 - n_old, tiles * W - n  # padded so that tile t's keys start at padded index t * W
    pad = (0, 0, front, back)
    kt = torch.nn.functional.pad(keys, pad).unfold(1, 2 * W - 1, W).permute(1, 0, 3, 2)  # [tiles, H, 2W-1, D]
    vt = torch.nn.functional.pad(vals, pad).unfold(1, 2 * W - 1, W).permute(1, 0, 3, 2)
    qt = torch.nn.functional.pad(q, (0, 0, 0, 0, 0, back)).view(tiles, W, Hq, D)
    a = torch.arange(W, device=q.device)[:, None]  # a query's place in its tile
    c = torch.arange(2 * W - 1, device=q.device)[None, :]  # a key's place in its tile's span
    j = torch.arange(tiles, device=q.device)[:, None, None] * W + c - front  # [tiles, 1, 2W-1]: index into keys
    valid = (j >= 0) & (c >= a) & (c <= a + W - 1)  # query a's window (p - W, p], no front pad
    return _attn(qt, kt, vt, valid).reshape(tiles * W, Hq, D)[:n]


def _attn(q, k, v, valid):
    """q [B, nq, Hq, D]; k, v [B, H, T, D]; valid bool [B, nq, T] -> [B, nq, Hq, D] (float32 softmax)."""
    B, nq, Hq, D = q.shape
    H = k.shape[1]
    G = Hq // H
    qf = q.float().view(B, nq, H, G, D)
    s = torch.einsum("bnhgd,bhtd->bnhgt", qf, k.float()) / math.sqrt(D)
    s = s.masked_fill(~valid[:, :, None, None, :], -math.inf)
    o = torch.einsum("bnhgt,bhtd->bnhgd", torch.softmax(s, -1), v.float())
    return o.reshape(B, nq, Hq, D).to(q.dtype)
