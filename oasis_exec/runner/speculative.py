"""Speculative decoding in the executor (``ExecConfig.speculative_k = k > 0``, modes ``dense`` and ``lookahead``).

A speculative step of a lane whose input token ``x_p`` sits at position ``p``:

1. **Draft** (``Drafts.chain``): the head's first draft ``d_{p+1}`` is the one the previous step proposed
   (``propose``: the target's features at ``p - 1`` and ``x_p``); each further draft ``d_{p+j+1}`` is the head run
   on its own hidden state of the draft before and ``d_{p+j}`` (``DraftHead.chain``: EAGLE's chain, the head's
   hidden state standing in for the target features it has not got yet). Drafts are greedy: the draft
   distribution ``q`` is one-hot. The attention head (``draft_head = "attn"``, ``oasis_exec.model.draft_attn``)
   drafts the first only (k = 1; ``ExecConfig`` refuses k >= 2 with it: it is trained on the target's features only).
2. **Verify** (``ModelExec.decode_spec``): one target pass over the ``k + 1`` positions ``p .. p + k`` of every lane.
   Position ``p`` attends as the ordinary step does; position ``p + j`` attends the same plus the KV of positions
   ``p + 1 .. p + j`` (``dense``: the pages, which hold them; ``lookahead``: the resident set and the local block
   with the drafts' KV as ``sparse_attn``'s extra entries, query ``t`` attending extras ``e < t``). Every position of
   a lookahead step attends the resident set the step began with.
3. **Accept** (``accept``): the longest prefix of drafts the target accepts, plus one token from the target: greedy
   rows accept ``d`` while it is the target's argmax and then emit the argmax (the bonus token); rows above
   temperature 0 accept ``d`` with probability ``min(1, p(d) / q(d)) = p(d)`` (``q`` one-hot) and, at the first
   rejection, draw from ``normalize(max(0, p - q))`` (``p`` with ``d`` removed), else from ``p`` after the last
   draft, so the emitted tokens follow the target's distribution (``p``: ``sampling.sample``'s, temperature and
   top_p). Never more than the step may emit (``DecodeItem.max_new``: the runner drafts ``min(k, max_new - 1)``).
4. **Keep** (``ModelExec.commit_spec``): only accepted tokens' KV enter the cache. ``lookahead``: the accepted
   drafts' KV (kept from the pass) are written into the local block; a block that fills in the middle of the run
   gets its summary and its host copy from the local slot before the tokens after it overwrite that slot as the
   new local block (``k < block_size``: a step fills at most one block). Nothing of a rejected draft is written,
   so the per-head maps (resident tables, recency) and the summaries never see one. ``dense``: the pass wrote all
   ``k + 1`` positions into the pages; those past the accepted run lie beyond the context, which every read is
   bounded by, and the next step writes them again before any query can reach them.
5. **Lookahead** (``lookahead``): after the acceptance each layer's background prediction is launched, for the
   next step's position ``p' = p + n + 1`` (``n`` accepted), from the pass's query at ``p'`` (a rejected draft's
   query, which is what the ordinary step's draft query is) or, when every draft was accepted, at ``p + k``; the
   blocks it may pick are the full ones at ``p'``, so a block filled in the middle of the run is among them. A step
   whose drafts are all rejected is then the ordinary lookahead step: the same attention, the same prediction.
6. **Resync** (``Drafts.resync``): the next step's first draft is proposed from the target's own features at the
   last accepted position ``p + n`` and the token emitted last (``propose``), whatever the head drafted before. The
   attention head first appends positions ``p .. p + n`` to its own K/V from the pass's features there and the
   emitted tokens (``AttnDraftHead.propose_accepted``: a write a position, masked to the accepted run, so a rejected
   draft's position never enters it).

**Adaptive k** (``speculative_k = "auto"`` / ``"auto:N"``; ``oasis_core.speculation``): each lane's draft length
``k_i`` is chosen every step from its own acceptance estimate and the draft's relative cost γ (``Runner._spec_k``);
the chain and the pass run the step's longest ``k = max k_i``, and ``accept`` / ``greedy_accepted`` take the lanes'
``limits``: drafts past ``k_i`` count as rejected without a residual (a lane that accepts its ``k_i`` draws from ``p``
after them), which emits exactly what a ``k_i``-draft pass would. A step where every lane picks 0 is the ordinary one.

Greedy and synthetic acceptance are decided on the device (``greedy_accepted``, ``emitted_tokens``), so the whole
step after the chain (``ModelExec.spec_core``: pass, acceptance, commit with every write masked to the accepted run,
resync) needs one host synchronisation, at its end, and runs as a CUDA graph wherever the ordinary step may
(``DecodeGraphs.spec_chain`` / ``spec_step``: one graph per batch size, draft length and acceptance kind). Steps with
a row above temperature 0 run eagerly (``accept`` draws on the host between the pass and the commit). Speculative
steps run only while no lane of the step is short or crossing (``oasis_core.short_context``): such a step, and a
step that may emit only one token, is the ordinary step. A speculative lookahead step launches its background
transfers after the whole pass (the prediction needs the acceptance), not layer by layer during it: inside the
step's graph they run behind the commit only (``copy_graph`` on: behind the next step's chain and first layers).
With ``spec_predict = "beside"`` (``oasis_exec.workingset.spec_pipeline``) they run beside the pass instead, from the
likeliest query, and an exact repair after the acceptance copies what the true position's prediction adds.
"""

from __future__ import annotations

import torch


def target_probs(logits, params):
    """The distributions ``sampling.sample`` draws from, float64 [N, V]: one-hot at the argmax at temperature 0,
    else ``softmax(logits / T)`` cut to its nucleus (``top_p``, the first token always kept) and renormalised."""
    N, V = logits.shape
    out = torch.zeros(N, V, dtype=torch.float64, device=logits.device)
    greedy = [i for i, sp in enumerate(params) if sp.temperature == 0]
    if greedy:
        g = torch.tensor(greedy, device=logits.device)
        out[g, logits[g].argmax(-1)] = 1.0
    hot = [i for i, sp in enumerate(params) if sp.temperature > 0]
    if hot:
        rows = torch.tensor(hot, device=logits.device)
        temps = torch.tensor([params[i].temperature for i in hot], dtype=torch.float64, device=logits.device)
        probs = torch.softmax(logits[rows].double() / temps[:, None], -1)
        p_sorted, order = probs.sort(dim=-1, descending=True, stable=True)
        tp = torch.tensor([float(getattr(params[i], "top_p", 1.0)) for i in hot], dtype=torch.float64)
        before = p_sorted.cumsum(-1) - p_sorted
        p_sorted = torch.where(before < tp.to(logits.device)[:, None], p_sorted, torch.zeros_like(p_sorted))
        kept = torch.zeros_like(probs).scatter_(-1, order, p_sorted)
        out[rows] = kept / kept.sum(-1, keepdim=True)
    return out


def _limits(limits, B, k, device):
    """[B] int64: the drafts each row may accept (``limits``: a row's own draft length ``k_i <= k``; None: ``k``)."""
    if limits is None:
        return None
    return torch.as_tensor(limits, dtype=torch.int64, device=device).clamp(0, k)


def greedy_accepted(logits, drafts, lim):
    """Device-only greedy verification (no host synchronisation: CUDA-graph capturable): logits [B, k + 1, V] of the
    pass, drafts [B, k], lim [B] int64 (a row's own draft length ``k_i <= k``) -> (accepted drafts a row [B] int64,
    the target's argmax at every position [B, k + 1]): a row accepts its drafts while each is the target's argmax,
    at most ``lim``."""
    k = drafts.shape[1]
    tgt = logits.argmax(-1)
    n = (tgt[:, :k] == drafts).to(torch.int64).cumprod(1).sum(1)
    return torch.minimum(n, lim), tgt


def emitted_tokens(tgt, drafts, n):
    """Device-only: the tokens a row emits, [B, k + 1] of which a row's first ``n + 1`` count: its ``n`` accepted
    drafts, then the target's token after them (``tgt`` [B, k + 1]: the argmax, or any per-position choice)."""
    j = torch.arange(tgt.shape[1], device=tgt.device)
    padded = torch.cat([drafts, tgt[:, -1:]], 1)
    return torch.where(j < n[:, None], padded, tgt)


def rows_of(n, emitted) -> tuple:
    """Host lists of a step's acceptance (the step's one host synchronisation): (accepted drafts a row, the emitted
    tokens a row)."""
    n_l, e_l = n.tolist(), emitted.tolist()
    return n_l, [row[: m + 1] for row, m in zip(e_l, n_l)]


def accept(logits, drafts, params, u_acc, u_draw, limits=None):
    """Verification of greedy drafts (``q`` one-hot) by rejection sampling against the target's distributions
    (``target_probs``; temperature 0 rows reduce to ``greedy_accepted``'s rule). logits [B, k + 1, V]; drafts [B, k];
    params: SamplingParams a row; u_acc, u_draw [B, k + 1]: uniform draws in [0, 1) per row and emitted position
    (``u_acc[:, j]`` decides draft ``j``, ``u_draw[:, j]`` draws the token when position ``j`` is the row's last).
    ``limits`` [B]: a row's own draft length ``k_i <= k`` (adaptive k): drafts past it were never proposed, so a
    row that accepts all its ``k_i`` draws the token after them from ``p`` (not from a residual).
    Returns (accepted drafts a row, the emitted tokens a row)."""
    B, T, V = logits.shape
    k = T - 1
    dev = logits.device
    p = target_probs(logits.reshape(B * T, V), [sp for sp in params for _ in range(T)]).view(B, T, V)
    u_acc = torch.as_tensor(u_acc, dtype=torch.float64, device=dev)
    u_draw = torch.as_tensor(u_draw, dtype=torch.float64, device=dev)
    pd = p[:, :k].gather(-1, drafts[..., None])[..., 0]  # [B, k] target probability of each draft
    ok = u_acc[:, :k] < pd  # accepted with probability min(1, p(d) / 1)
    lim = _limits(limits, B, k, dev)
    if lim is not None:
        ok &= torch.arange(k, device=dev) < lim[:, None]
    n = ok.to(torch.int64).cumprod(1).sum(1)
    ar = torch.arange(B, device=dev)
    last = p[ar, n].clone()  # [B, V]: the distribution of the token after the accepted run
    rej = n < (k if lim is None else lim)  # a draft was rejected (not merely past the row's length)
    if bool(rej.any()):
        rr = ar[rej]
        last[rr, drafts[rr, n[rej]]] = 0.0  # normalize(max(0, p - q)) with q one-hot at the rejected draft
    cdf = last.cumsum(-1)
    u = u_draw[ar, n][:, None] * cdf[:, -1:]
    tok = torch.searchsorted(cdf, u, right=True).clamp_(max=V - 1)[:, 0]
    # a draw can land on a zero-probability token only through rounding at the top of the cdf: take the last
    # token of positive mass then
    bad = last[ar, tok] <= 0
    if bool(bad.any()):
        pos = (last > 0).to(torch.int64) * torch.arange(1, V + 1, device=dev)
        tok = torch.where(bad, pos.argmax(-1), tok)
    n_l, tok_l, d_l = n.tolist(), tok.tolist(), drafts.tolist()
    return n_l, [d[:m] + [t] for d, m, t in zip(d_l, n_l, tok_l)]
