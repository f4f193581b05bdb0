"""The acceptance rules of speculative steps (``oasis_exec.runner.speculative``) on a small vocabulary.

The target is a Markov chain over 6 tokens (its logits depend on the previous token only), the draft a greedy chain
of another one; a speculative decoder of 3 tokens runs in 12,000 seeded trials at once. The sequences it emits must
follow the target's distribution (a chi-square test over the 216 sequences, cells of small expectation pooled, at
p = 1e-5), and the same statistic must reject two wrong rules: drafts accepted whenever the target allows them, and
a rejection redrawn from the target's whole distribution instead of ``max(0, p - q)``, so that the test can fail.
"""

import math

import pytest
import torch

from oasis_exec.engine.scheduler import SamplingParams
from oasis_exec.runner.sampling import sample
from oasis_exec.runner.speculative import accept, emitted_tokens, greedy_accepted, rows_of, target_probs

V, TRIALS, LENGTH = 6, 12_000, 3


def _chain(seed):
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randn(V, V, generator=g) * 1.5  # logits of the next token given the previous one
    draft = tgt + torch.randn(V, V, generator=g) * 1.5  # a draft that agrees with the target now and then
    return tgt, draft.argmax(-1)


def _speculate(tgt, draft_next, sp, k, seed, rule="exact"):
    """TRIALS runs of a speculative decoder from token 0 until LENGTH tokens; returns [TRIALS, LENGTH] tokens."""
    g = torch.Generator().manual_seed(seed)
    last = torch.zeros(TRIALS, dtype=torch.int64)
    out = [[] for _ in range(TRIALS)]
    while min(len(o) for o in out) < LENGTH:
        d = [draft_next[last]]
        for _ in range(k - 1):
            d.append(draft_next[d[-1]])
        drafts = torch.stack(d, 1)  # [T, k]
        prev = torch.cat([last[:, None], drafts], 1)  # the token before each verified position
        logits = tgt[prev]  # [T, k + 1, V]
        u_acc = torch.rand(TRIALS, k + 1, generator=g, dtype=torch.float64)
        u_draw = torch.rand(TRIALS, k + 1, generator=g, dtype=torch.float64)
        if rule == "always":
            u_acc = torch.zeros_like(u_acc)
        params = [sp] * TRIALS
        if rule == "redraw_from_p":  # wrong: a rejected position drawn from p, the draft not removed
            n, toks = accept(logits, drafts, params, u_acc, torch.ones_like(u_draw) * 2)  # n only
            p = target_probs(logits.reshape(-1, V), [sp] * (TRIALS * (k + 1))).view(TRIALS, k + 1, V)
            ar = torch.arange(TRIALS)
            nt = torch.tensor(n)
            cdf = p[ar, nt].cumsum(-1)
            t = torch.searchsorted(cdf, u_draw[ar, nt][:, None] * cdf[:, -1:], right=True).clamp(max=V - 1)[:, 0]
            toks = [dr[:m] + [int(x)] for dr, m, x in zip(drafts.tolist(), n, t)]
        else:
            n, toks = accept(logits, drafts, params, u_acc, u_draw)
        for o, t in zip(out, toks):
            o.extend(t)
        last = torch.tensor([o[-1] for o in out])
    return torch.tensor([o[:LENGTH] for o in out])


def _expected(tgt, sp):
    """The target's probability of every LENGTH-token sequence from token 0, [V ** LENGTH]."""
    p = target_probs(tgt, [sp] * V)  # [V, V]: row = previous token
    probs = torch.ones(1, dtype=torch.float64)
    prev = torch.zeros(1, dtype=torch.int64)
    for _ in range(LENGTH):
        probs = (probs[:, None] * p[prev]).reshape(-1)
        prev = torch.arange(V).repeat(len(prev))
    return probs


def _chi2(seqs, expected):
    idx = (seqs * torch.tensor([V**i for i in reversed(range(LENGTH))])).sum(1)
    counts = torch.bincount(idx, minlength=V**LENGTH).double()
    exp = expected * TRIALS
    small = exp < 5  # pooled into one cell
    obs = torch.cat([counts[~small], counts[small].sum()[None]])
    ex = torch.cat([exp[~small], exp[small].sum()[None]])
    keep = ex > 0
    stat = float(((obs[keep] - ex[keep]) ** 2 / ex[keep]).sum())
    return stat, int(keep.sum()) - 1


def _critical(df, z=4.265):  # p = 1e-5 one-sided, Wilson-Hilferty
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "sp,k",
    [(SamplingParams(temperature=1.0), 2), (SamplingParams(temperature=0.7, top_p=0.8), 3)],
)
def test_rejection_sampling_keeps_the_target_distribution(sp, k):
    tgt, draft_next = _chain(1)
    expected = _expected(tgt, sp)
    stat, df = _chi2(_speculate(tgt, draft_next, sp, k, seed=2), expected)
    assert stat < _critical(df), f"chi2 {stat:.1f} over {df} degrees of freedom"
    for rule in ("always", "redraw_from_p"):  # the same test rejects wrong rules
        bad, _ = _chi2(_speculate(tgt, draft_next, sp, k, seed=2, rule=rule), expected)
        assert bad > 3 * _critical(df), f"{rule}: chi2 {bad:.1f} over {df} degrees of freedom"


def test_rejection_sampling_accepts_often_when_the_draft_is_good():
    tgt, _ = _chain(1)
    sp = SamplingParams(temperature=0.5)
    good = tgt.argmax(-1)  # the target's own argmax: accepted with probability p(argmax)
    seqs = _speculate(tgt, good, sp, 2, seed=3)
    stat, df = _chi2(seqs, _expected(tgt, sp))
    assert stat < _critical(df)


def accept_greedy(logits, drafts, limits=None):
    """The executor's greedy acceptance (``ModelExec.spec_core``: ``greedy_accepted``, ``emitted_tokens``) as host
    lists, as ``rows_of`` reads them after the step."""
    B, k = drafts.shape
    lim = torch.full((B,), k) if limits is None else torch.tensor(limits)
    n, tgt = greedy_accepted(logits, drafts, lim)
    return rows_of(n, emitted_tokens(tgt, drafts, n))


def test_greedy_rows_take_the_longest_agreeing_prefix_and_the_argmax():
    logits = torch.full((3, 4, V), -5.0)
    best = torch.tensor([[1, 2, 3, 4], [5, 0, 1, 2], [2, 2, 2, 2]])
    logits.scatter_(-1, best[..., None], 5.0)
    drafts = torch.tensor([[1, 2, 0], [4, 0, 1], [2, 2, 2]])
    n, toks = accept_greedy(logits, drafts)
    assert n == [2, 0, 3] and toks == [[1, 2, 3], [5], [2, 2, 2, 2]]
    u = torch.rand(3, 4, dtype=torch.float64)
    assert accept(logits, drafts, [SamplingParams()] * 3, u, u) == (n, toks)  # temperature 0: the same rule


@pytest.mark.parametrize("sp", [SamplingParams(temperature=0.9), SamplingParams(temperature=1.3, top_p=0.7)])
def test_target_probs_is_what_sample_draws_from(sp):
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0)) * 2
    p = target_probs(logits, [sp, sp])
    n = 20_000
    u = ((torch.arange(n) + 0.5) / n).tolist()  # a grid of draws: inverse-CDF sampling returns each token in
    for r in range(2):  # proportion to its probability, up to one grid step
        toks = sample(logits[r : r + 1].expand(n, -1), [sp] * n, u)
        freq = torch.bincount(toks, minlength=50).double() / n
        assert (freq - p[r]).abs().max() <= 1.5 / n
    assert torch.allclose(p.sum(-1), torch.ones(2, dtype=torch.float64))


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.6)])
def test_a_row_limit_is_the_shorter_chain(sp):
    """Adaptive k (``limits``): a row verified in a pass of k drafts with its own length k_i accepts and emits
    exactly what a pass of its k_i drafts would, with the same draws (drafts past k_i were never proposed)."""
    g = torch.Generator().manual_seed(4)
    B, k = 64, 4
    tgt, draft_next = _chain(5)
    good = tgt.argmax(-1)
    last = torch.randint(0, V, (B,), generator=g)
    d = [torch.where(torch.rand(B, generator=g) < 0.7, good[last], draft_next[last])]
    for _ in range(k - 1):
        d.append(torch.where(torch.rand(B, generator=g) < 0.7, good[d[-1]], draft_next[d[-1]]))
    drafts = torch.stack(d, 1)
    logits = tgt[torch.cat([last[:, None], drafts], 1)]
    u_acc = torch.rand(B, k + 1, generator=g, dtype=torch.float64)
    u_draw = torch.rand(B, k + 1, generator=g, dtype=torch.float64)
    limits = (torch.arange(B) % (k + 1)).tolist()
    params = [sp] * B
    n, toks = accept(logits, drafts, params, u_acc, u_draw, limits)
    if sp.temperature == 0:
        assert accept_greedy(logits, drafts, limits) == (n, toks)
    for ki in range(k + 1):
        rows = [i for i in range(B) if limits[i] == ki]
        r = torch.tensor(rows)
        n1, t1 = accept(
            logits[r, : ki + 1], drafts[r, :ki], params[: len(rows)], u_acc[r, : ki + 1], u_draw[r, : ki + 1]
        )
        assert [n[i] for i in rows] == n1 and [toks[i] for i in rows] == t1, ki
    assert max(n) >= 2 and 0 in n  # accepted runs of several lengths
