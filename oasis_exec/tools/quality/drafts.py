"""The four drafts of the selection harness: each gives ``d_{t+1}``, the guess of the token after ``x_t``, for the
measured decode positions ``t``.

- ``eagle3``: the EAGLE-3-style head (``oasis_exec.model.draft.DraftHead``; trained weights from a directory, or random
  weights when none is given: the results then say so). At the end of step t-1 the head reads the target's
  residuals after ``aux_layers`` at position t-1 (the position that produced ``x_t``) and ``x_t``'s embedding.
- ``ngram``: prompt lookup over ``x_0 .. x_t`` (``oasis_core.prompt_lookup``; n = 3..1, fallback: repeat ``x_t``).
- ``oracle``: the target's own greedy token at position t (argmax of its logits there): an upper bound, since the
  engine must choose the draft before step t's forward.
- ``random``: a uniform random token id (seeded): the lower bound.
- ``eagle3_attn``: the full EAGLE-3 layer over its own K/V of every earlier position (``oasis_exec.model.draft_attn``);
  drawn by ``quality/generation.attn_draft_tokens`` (it needs every position's features), not here.
- ``ngram_attn``: the two together, as an engine could run them: the n-gram guess where the context's last
  ``NGRAM_MIN_MATCH`` or more tokens occurred before (``prompt_lookup.match_lengths_at``), else ``eagle3_attn``'s
  (``combine_ngram``). Prompt lookup gains with context (more text to match), the head does not.
- ``ngram1_attn``: the same with a one-token match enough (the n-gram's guess wherever it has one).
- ``eagle3_attn_2nd``: the attention head's second-best token.
- ``ngram_attn_gate``: ``ngram_attn`` as the engine serves it by default (``ExecConfig.draft_gate``, ``DRAFT_GATE``):
  where prompt lookup has no match and the head gives its token a probability under the gate, the step predicts from
  the current query (the proxy's prediction) instead of the draft's (``GATED``). Its token accuracy is the pair's.
- ``attn_soft``: the attention head's best ``SOFT`` tokens as one row whose input embedding is theirs weighted by
  the head's probabilities (renormalised over them): an unsure head's candidates averaged before the target's layers
  instead of the best one alone. Its token accuracy is the head's.
- Hedged drafts (``HEDGED``): two queries score every block and a block's score is the larger of the two (as if the
  second query were more query heads of the group, ``score_blocks``'s max); the top-K of that. ``attn_top2``: the
  head's two best tokens (a second draft row a lane); ``attn_cur`` and ``ngram_attn_cur``: the draft and the current
  query (the row the step computes anyway: no extra row). Their token accuracy is the first component's.
"""

from __future__ import annotations

import torch

from oasis_core.prompt_lookup import match_lengths_at, propose_at

from ...config import DRAFT_GATE, DRAFT_NGRAM

DRAFTS = ("eagle3", "ngram", "oracle", "random")  # the default set
# the engine's (ExecConfig.draft_ngram's lookahead default): a one-token match (any token seen before) is weak
# evidence at long context
NGRAM_MIN_MATCH = DRAFT_NGRAM
# n-gram where it matches (at least this many tokens), else eagle3_attn
PAIRED = {"ngram_attn": NGRAM_MIN_MATCH, "ngram1_attn": 1}
# eagle3_attn: the full EAGLE-3 layer (quality/generation.py), alone or in the PAIRED drafts
# a hedge: (first draft, second draft or "cur", the current query)
HEDGED = {
    "attn_top2": ("eagle3_attn", "eagle3_attn_2nd"),
    "attn_cur": ("eagle3_attn", "cur"),
    "ngram_attn_cur": ("ngram_attn", "cur"),
    "ngram_attn_top2": ("ngram_attn", "eagle3_attn_2nd"),
}
# a gated draft: (its draft, the gate): the current query where the draft is the head's at a probability under the gate
GATED = {"ngram_attn_gate": ("ngram_attn", DRAFT_GATE)}
# a soft draft: the row's input is the head's best tokens' embeddings weighted by their renormalised probabilities
SOFT = {"attn_soft": 4}
ALL_DRAFTS = DRAFTS + ("eagle3_attn", "eagle3_attn_2nd", *PAIRED, *HEDGED, *GATED, *SOFT)
ATTN_DRAFTS = ("eagle3_attn", "eagle3_attn_2nd", *PAIRED, *HEDGED, *GATED, *SOFT)  # the drafts that need the head


def components(d: str) -> tuple:
    """(the row draft whose query ``d`` reads, its second query or None): a hedge's two, a gated draft's own draft
    (the current query replaces it where gated), else ``d`` itself."""
    if d in HEDGED:
        return HEDGED[d]
    return (GATED[d][0] if d in GATED else d), None


def row_drafts(drafts) -> list:
    """The drafts that need a draft row of their own for ``drafts``: the plain ones, the hedges' components and the
    gated drafts' own."""
    out = []
    for d in drafts:
        for c in components(d):
            if c is not None and c != "cur" and c not in out:
                out.append(c)
    return out


def lookup_matched(tokens, positions, min_match: int = NGRAM_MIN_MATCH):
    """bool [P]: whether prompt lookup's suffix match at each position is at least ``min_match`` tokens long."""
    n = torch.tensor(match_lengths_at(torch.as_tensor(tokens).tolist(), torch.as_tensor(positions).tolist()))
    return n >= min_match


def combine_ngram(tokens, positions, ngram, fallback, min_match: int = NGRAM_MIN_MATCH):
    """``ngram_attn``: ids [P], the n-gram draft ``ngram`` [P] where the suffix match at each position is at least
    ``min_match`` tokens long, else ``fallback`` [P]."""
    hit = lookup_matched(tokens, positions, min_match)
    return torch.where(hit, torch.as_tensor(ngram), torch.as_tensor(fallback))


def gated_positions(tokens, positions, head_prob, gate: float, min_match: int = NGRAM_MIN_MATCH):
    """bool [P]: where a gated ``ngram_attn`` predicts from the current query: no lookup match and the head's
    probability of its token ``head_prob`` [P] under ``gate`` (lookup's drafts count as certain, as in the engine)."""
    return ~lookup_matched(tokens, positions, min_match) & (torch.as_tensor(head_prob).cpu() < gate)


def draft_tokens(name: str, tokens, positions, *, greedy=None, aux=None, head=None, vocab: int = 0, seed: int = 0):
    """Draft ids int64 [P] for positions ``positions`` [P] of ``tokens`` [N].

    greedy: [P] the target's argmax at each position (``oracle``); aux: [P, 3 * hidden] residuals at ``t - 1``
    (``eagle3``, with ``head``); vocab: the vocabulary size (``random``)."""
    tokens = torch.as_tensor(tokens)
    positions = torch.as_tensor(positions)
    if name == "oracle":
        return greedy.long().cpu()
    if name == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.randint(vocab, (positions.shape[0],), generator=g)
    if name == "ngram":
        return torch.tensor(propose_at(tokens.tolist(), positions.tolist()), dtype=torch.long)
    if name == "eagle3":
        ids = tokens[positions].to(aux.device)
        with torch.no_grad():
            return head.propose(aux.to(head.w["fc.weight"].dtype), ids).long().cpu()
    raise ValueError(f"draft {name!r}: unknown; choose from {', '.join(DRAFTS)}")
