"""Exploration that chose the scorers (SmolLM2-135M, CPU, fp32): the next query's attention mass (+ local block) held by
the top-K of many candidate block scores, with and without block 0 forced in (the sink), one text, one K.

    python experiments/block_scorers/explore_smollm2.py 2048 GPL-3 0.125

Candidates over min/max summaries: the bound ``q.c + lam |q|.r`` (c, r: the block's centre and half range; lam = 1
is Quest's bound, lam < 1 shrinks it towards the centre), pooled over a KV head's query heads by max, sum or
log-sum-exp of the scaled bound; over mean / std summaries: ``mean_sum`` (q . mean summed), ``gauss`` (the log-mass
estimate of oasis_core.block_scorers, by lse or sum), ``meansd`` (``c q.mean + lam c |q|.std``, by lse); ``best`` is
the K blocks of most true mass. Printed best first (mean over layers, P = 16 positions at the end of the text).
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from oasis_core.block_scorers import build
from oasis_core.scoring import build_summaries, topk_blocks
from oasis_exec.model.draft import aux_layers
from oasis_exec.tools.quality import metrics
from oasis_exec.tools.quality.selection import _load, dense_trace
from oasis_exec.tools.quality.texts import token_ids

torch.set_num_threads(1)


class A:
    model_path = None
    dtype = 'float32'
    device = 'cpu'
    n_layers = None


path, dec, tok = _load(A)
N = int(sys.argv[1])
P = 16
bs = 16
ids = token_ids(tok, sys.argv[2], N)
n = len(ids)
ts = torch.arange(n - 1 - P, n - 1)

tr = dense_trace(dec, torch.tensor(ids), ts, aux_layers(dec.shape.n_layers))
nbt1 = (ts + 1) // bs + 1
fr = float(sys.argv[3])
K = max(1, round(fr * (-(-n // bs))))
res = {}


def sel(s):
    p_, h, nb = s.shape
    return topk_blocks(s.reshape(p_ * h, nb), K, nbt1.repeat_interleave(h)).view(p_, h, K)


for li in range(dec.shape.n_layers):
    k = tr.k[li].float()
    q = tr.q_next[li].float()
    hkv = k.shape[1]
    d = k.shape[2]
    c = 1 / math.sqrt(d)
    probs = metrics.attention_probs(q, k, ts + 2)
    mass = metrics.block_mass(probs, bs, hkv)
    keys = k.transpose(0, 1)
    kmin, kmax = build_summaries(keys, bs)
    mu, sd = build(keys, bs, 'gauss')
    P_, hq, _ = q.shape
    qg = q.view(P_, hkv, hq // hkv, d)
    ctr = (kmin + kmax) / 2
    rad = (kmax - kmin) / 2
    qc = torch.einsum('phgd,hnd->phgn', qg, ctr)
    qr = torch.einsum('phgd,hnd->phgn', qg.abs(), rad)
    qm = torch.einsum('phgd,hnd->phgn', qg, mu)
    qv = torch.einsum('phgd,hnd->phgn', qg * qg, sd * sd)
    cand = {}
    for lam in (1.0, 0.75, 0.5):
        ub = qc + lam * qr
        cand[f'bound{lam}_max'] = ub.amax(2)
        cand[f'bound{lam}_sum'] = ub.sum(2)
        cand[f'bound{lam}_lse'] = torch.logsumexp(c * ub, 2)
    g = c * qm + 0.5 * c * c * qv
    cand['gauss_lse'] = torch.logsumexp(g, 2)
    cand['gauss_sum'] = g.sum(2)
    cand['mean_sum'] = qm.sum(2)
    for lam in (0.5, 1.0):
        gg = c * qm + lam * c * torch.einsum('phgd,hnd->phgn', qg.abs(), sd)
        cand[f'meansd{lam}_lse'] = torch.logsumexp(gg, 2)
    cand['best'] = mass
    local = (ts + 1) // bs
    for nm, s in cand.items():
        t = sel(s)
        res.setdefault(nm, []).append(metrics.captured_mass(mass, t, local).mean().item())
        s2 = s.clone()
        s2[..., 0] = float('inf')
        t = sel(s2)
        res.setdefault(nm + '+sink', []).append(metrics.captured_mass(mass, t, local).mean().item())
for nm, v in sorted(res.items(), key=lambda x: -sum(x[1])):
    print(f'{nm:<20} {100 * sum(v) / len(v):5.1f}')
