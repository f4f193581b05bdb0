"""What a Gemma 32K scorer must do (issue 38): mass captured (block 0 forced in, as ``+sink``) of score variants on a
``gemma_chunked.py --dump`` (or an early keys-and-queries dump), K = 64 / 128 / 256 blocks.

- ``exact_lse`` / ``exact_norm``: every token's true ``q . k``, a block's log-sum-exp per query head, the group pooled
  by a plain log-sum-exp / after normalising each head over the blocks (``exact_norm`` ranks by the measured mass
  itself, so it equals ``best``): what per-token resolution and per-head normalisation are each worth;
- ``centM_*``: M sub-block mean keys per block (several centroids a block) under the same poolings; ``mean_*``;
- ``lr_{basis}{r}_*`` with a calibration dump (``gemma_chunked.py --calib``): per-token keys projected on a basis
  fitted there: ``kpca`` / ``qpca`` (top eigenvectors of the keys' / queries' second moment), ``qk`` (of
  ``(Cq Ck + Ck Cq) / 2``), ``qpair`` / ``qkpair`` (RoPE channel pairs by query energy / by ``E[q^2] E[k^2]``).

    python experiments/block_scorers/explore_gemma32k.py DUMP.pt [CALIB.pt]     (RS="32 64": the ranks)
"""

from __future__ import annotations

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oasis_core.block_scorers import build, score  # noqa: E402
from oasis_core.scoring import topk_blocks  # noqa: E402
from oasis_exec.tools.quality import metrics  # noqa: E402

BS, KS = 16, (64, 128, 256)
RS = tuple(int(x) for x in os.environ.get("RS", "32 64").split())


def combine(s, how):
    """[P, Hkv, G, N] per-head log-mass estimates -> [P, Hkv, N]."""
    if how == "lse":
        return torch.logsumexp(s, 2)
    if how == "norm":
        return torch.logsumexp(s - torch.logsumexp(s, -1, keepdim=True), 2)
    return s.sum(2)


def per_block(st, n):
    """Per-token log scores [P, Hkv, G, T] -> per-block log-sum-exp [P, Hkv, G, N]."""
    p, h, g, t = st.shape
    st = torch.cat([st, st.new_full((p, h, g, n * BS - t), -math.inf)], -1)
    return torch.logsumexp(st.view(p, h, g, n, BS), -1)


def bases(calib, li, d):
    kc = calib["k"][li].float().reshape(-1, d)
    qc = calib["q"][li].float().reshape(-1, d)
    ck, cq = kc.T @ kc / len(kc), qc.T @ qc / len(qc)
    h2, out = d // 2, {}
    for r in RS:
        out[f"kpca{r}"] = torch.linalg.eigh(ck)[1][:, -r:]
        out[f"qpca{r}"] = torch.linalg.eigh(cq)[1][:, -r:]
        out[f"qk{r}"] = torch.linalg.eigh((cq @ ck + ck @ cq) / 2)[1][:, -r:]
        eq, ek = torch.diag(cq), torch.diag(ck)
        for name, w in (("qpair", eq[:h2] + eq[h2:]), ("qkpair", eq[:h2] * ek[:h2] + eq[h2:] * ek[h2:])):
            top = torch.argsort(w, descending=True)[: r // 2]
            out[f"{name}{r}"] = torch.eye(d)[:, torch.cat([top, top + h2])]
    return out


def main() -> int:
    d = torch.load(sys.argv[1])
    calib = torch.load(sys.argv[2]) if len(sys.argv) > 2 else None
    ts = d["ts"]
    if "kc" in d:
        keys_by_layer = {i: d["kc"][i] for i in d["qk"]}
        q_next = {i: d["qk"][i][1:] for i in d["qk"]}
    else:
        keys_by_layer, q_next = d["k"], d["q_next"]
    res = {}
    for li, k in keys_by_layer.items():
        q = q_next[li].float()
        t_len, n = k.shape[0], -(-k.shape[0] // BS)
        p_, hq, dim = q.shape
        hk = k.shape[1]
        c = 1 / math.sqrt(dim)
        mass = metrics.block_mass(metrics.attention_probs(q, k, ts + 2), BS, hk)
        nb = (ts + 1) // BS + 1
        qg = q.view(p_, hk, hq // hk, dim)
        keys = k.float().transpose(0, 1)
        cands = {"best": mass}
        for nm in ("minmax", "minmax_sum", "mean"):
            cands[nm] = score(q, *(x[None] for x in build(keys, BS, nm)), nm, c)
        causal = (torch.arange(t_len)[None, :] < (ts + 2)[:, None])[:, None, None, :]
        st = (c * torch.einsum("phgd,htd->phgt", qg, keys)).masked_fill(~causal, -math.inf)
        for how in ("lse", "norm"):
            cands[f"exact_{how}"] = combine(per_block(st, n), how)
        for m in (1, 2, 4):
            mu = build(keys, BS // m, "mean")[0]
            ss = torch.logsumexp((c * torch.einsum("phgd,hnd->phgn", qg, mu)).view(p_, hk, -1, n, m), -1)
            for how in ("lse", "norm", "sum"):
                cands[f"{'mean' if m == 1 else f'cent{m}'}_{how}"] = combine(ss, how)
        for bn, basis in (bases(calib, li, dim) if calib else {}).items():
            stl = (c * torch.einsum("phgr,htr->phgt", qg @ basis, keys @ basis)).masked_fill(~causal, -math.inf)
            for how in ("lse", "norm"):
                cands[f"lr_{bn}_{how}"] = combine(per_block(stl, n), how)
        for nm, s in cands.items():
            s = s.clone()
            s[..., 0] = math.inf
            row = {}
            for kk in KS:
                ids = topk_blocks(s.reshape(p_ * hk, n), kk, nb.repeat_interleave(hk)).view(p_, hk, kk)
                row[kk] = metrics.captured_mass(mass, ids, (ts + 1) // BS).mean().item()
            res.setdefault(nm, []).append(row)
    for nm, rows in res.items():
        cells = [f"K={kk}: {100 * sum(r[kk] for r in rows) / len(rows):5.1f}" for kk in KS]
        print(f"{nm:<20}", "  ".join(cells), " per layer at K=256:", "/".join(f"{100 * r[256]:.0f}" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
