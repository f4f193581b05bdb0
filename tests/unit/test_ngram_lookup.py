"""The device prompt lookup (``oasis_exec.runner.ngram_drafts``) against the host reference
(``oasis_core.prompt_lookup.PromptLookup``), on the CPU.

- ``lookup`` over a batch of lanes of different lengths (random tokens with planted repeats, a match at the very
  start, none at all, lanes shorter than the n-gram) finds what ``PromptLookup(max(3, m), m).match()`` finds at every
  length, for shortest matches 1, 2 and 3, and never reads past a lane's length (the rest of a row is filled with
  tokens that would match).
- ``NgramDrafts``: prefill chunks and decode steps write the history; a step drafts the reference's token where it
  matched (probability 1 with the gate), keeps the head's elsewhere, and a lane without a whole prefill (a
  synthesized one, a missed chunk) never drafts from it; speculative steps' accepted drafts enter the history.
"""

import random
from types import SimpleNamespace

import pytest
import torch

from oasis_core.prompt_lookup import PromptLookup
from oasis_exec.runner.ngram_drafts import NgramDrafts, lookup


def _seqs(seed, n=12):
    """Token sequences: random with planted repeats (copies of earlier spans), small vocabularies (many short
    matches), one whose suffix matches at the very start, one with no repeat at all."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        vocab = rng.choice([3, 8, 50, 1000])
        s = [rng.randrange(vocab) for _ in range(rng.randrange(1, 60))]
        for _ in range(rng.randrange(3)):  # planted repeats
            if len(s) > 4:
                a = rng.randrange(len(s) - 3)
                s += s[a : a + rng.randrange(2, 6)] + [rng.randrange(vocab) for _ in range(rng.randrange(4))]
        out.append(s)
    out.append([7, 8, 9, 1, 2, 3, 4, 7, 8, 9])  # the suffix's earlier occurrence starts at 0: j = 3
    out.append([5, 6, 1, 2, 3, 4, 5, 6])  # a 2-gram at the start only
    out.append(list(range(100, 140)))  # no repeat: nothing matches
    out.append([4])  # shorter than any n-gram
    return out


def _reference(s, t, m):
    pl = PromptLookup(max_n=max(3, m), min_n=m).extend(s[:t])
    r = pl.match()
    return (False, 0) if r is None else (True, r[1])


@pytest.mark.parametrize("min_n", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lookup_is_prompt_lookup_at_every_length(min_n, seed):
    seqs = _seqs(seed)
    C = max(len(s) for s in seqs) + 5
    rows, lens, want = [], [], []
    for s in seqs:
        for t in range(1, len(s) + 1):
            # past the length: the suffix again and again (a lookup reading there would match)
            tail = (s[max(0, t - 3) : t] * C)[: C - t]
            rows.append(s[:t] + tail)
            lens.append(t)
            want.append(_reference(s, t, min_n))
    hist = torch.tensor(rows, dtype=torch.int32)
    found, j = lookup(hist, torch.tensor(lens), max(3, min_n), min_n)
    got = [(bool(f), int(i) if f else 0) for f, i in zip(found, j)]
    assert got == want
    assert any(f for f, _ in want) and not all(f for f, _ in want)
    starts = {i for f, i in want if f}
    assert min_n in starts  # a match whose n-gram begins at the very start (j = n) was among them


def test_lookup_edge_cases():
    h = torch.tensor([[7, 8, 9, 1, 2, 3, 4, 7, 8, 9, 0, 0]], dtype=torch.int32)
    assert [x.tolist() for x in lookup(h, torch.tensor([10]), 3, 2)] == [[True], [3]]  # the 3-gram at 0
    assert [x.tolist() for x in lookup(h, torch.tensor([3]), 3, 1)] == [[False], [0]]  # 9 not seen before
    h2 = torch.tensor([[1, 2, 1, 2, 1, 2, 9]], dtype=torch.int32)
    # the latest occurrence wins: suffix "1 2" (n = 3: "2 1 2" at 1..3) -> the token after it, index 4
    assert [x.tolist() for x in lookup(h2, torch.tensor([6]), 3, 2)] == [[True], [4]]
    # a lane of length 0 (a row never written) finds nothing
    assert lookup(h2, torch.tensor([0]), 3, 1)[0].tolist() == [False]


def _drafts(min_match, lanes=4, ctx=64, conf=True):
    tok = torch.full((lanes,), -5, dtype=torch.int64)
    c = torch.full((lanes,), 0.25) if conf else None
    return NgramDrafts(min_match, max_lanes=lanes, max_context=ctx, tok=tok, conf=c), tok, c


def _chunks(lane, toks, size):
    for a in range(0, len(toks), size):
        yield SimpleNamespace(lane=lane, start=a, tokens=toks[a : a + size], last=a + size >= len(toks))


@pytest.mark.parametrize("min_match", [1, 2, 3])
def test_steps_draft_the_reference_token_and_keep_the_head_elsewhere(min_match):
    rng = random.Random(min_match)
    ng, tok, conf = _drafts(min_match)
    seqs = {0: [rng.randrange(6) for _ in range(20)], 2: [rng.randrange(40) for _ in range(9)], 3: [1, 2, 3]}
    for lane, s in seqs.items():
        ng.admit(lane)
        for ch in _chunks(lane, s, 4):
            ng.prefill(ch)
    ng.admit(1)  # lane 1: synthesized (no prefill seen): never drafts from the lookup
    lanes = torch.tensor([0, 1, 2, 3])
    ctx = {lane: list(s) for lane, s in seqs.items()}
    ctx[1] = [0] * 30
    used = 0
    for _ in range(25):
        nxt = {lane: rng.randrange(6) for lane in ctx}  # each lane's input token this step
        for lane in ctx:
            ctx[lane].append(nxt[lane])
        head = torch.tensor([-1, -2, -3, -4])
        tok.copy_(head)
        conf.fill_(0.25)
        pos = torch.tensor([len(ctx[int(x)]) - 1 for x in lanes])
        ng.step(lanes, torch.tensor([nxt[int(x)] for x in lanes]), pos)
        for i, lane in enumerate(lanes.tolist()):
            f, j = _reference(ctx[lane], len(ctx[lane]), min_match)
            f = f and lane != 1
            used += f
            assert int(tok[lane]) == (ctx[lane][j] if f else int(head[i]))
            assert float(conf[lane]) == (1.0 if f else 0.25)
    assert ng.used == used > 0
    assert ng.hist[0, : len(ctx[0])].tolist() == ctx[0]
    assert ng.nbytes == 4 * 65 * 4


def test_a_missed_chunk_stops_the_lane_and_a_new_request_starts_over():
    ng, tok, _ = _drafts(1, conf=False)
    s = [5, 6, 7, 5, 6, 7, 5, 6]
    ch = list(_chunks(0, s, 3))
    ng.admit(0)
    ng.prefill(ch[0])
    ng.prefill(ch[2])  # the middle chunk missed
    ng.step(torch.tensor([0]), torch.tensor([7]), torch.tensor([len(s)]))
    assert int(tok[0]) == -5 and ng.used == 0
    ng.admit(0)
    for c in ch:
        ng.prefill(c)
    ng.step(torch.tensor([0]), torch.tensor([7]), torch.tensor([len(s)]))  # 5 6 7 5 6 7 5 6 7: -> 5
    assert int(tok[0]) == 5 and ng.used == 1


def test_gate_off_and_a_step_without_lookup_only_writes():
    ng, tok, conf = _drafts(2, conf=False)
    assert conf is None
    ng.admit(0)
    for c in _chunks(0, [1, 2, 3, 1, 2], 8):
        ng.prefill(c)
    ng.step(torch.tensor([0]), torch.tensor([3]), torch.tensor([5]), look=False)
    assert int(tok[0]) == -5 and ng.hist[0, :6].tolist() == [1, 2, 3, 1, 2, 3]
    ng.step(torch.tensor([0]), torch.tensor([1]), torch.tensor([6]))  # ... 2 3 1: "3 1" at 2..3 -> 2
    assert int(tok[0]) == 2


def test_accepted_drafts_enter_the_history():
    ng, tok, _ = _drafts(2, lanes=2, ctx=12)
    for lane in (0, 1):
        ng.admit(lane)
        for c in _chunks(lane, [9, 9, 9, 9], 8):
            ng.prefill(c)
    lanes, pos = torch.tensor([0, 1]), torch.tensor([4, 9])
    ng.step(lanes, torch.tensor([1, 1]), pos)
    emitted = torch.tensor([[2, 3, 4], [5, 6, 7]])
    ng.accepted(lanes, pos, emitted, torch.tensor([2, 2]))  # 2 accepted: positions pos + 1, pos + 2
    assert ng.hist[0, :8].tolist() == [9, 9, 9, 9, 1, 2, 3, 0]
    assert ng.hist[1, 9:12].tolist() == [1, 5, 6]
    ng.step(lanes, torch.tensor([4, 7]), pos + 3)  # past the context: the sink, never a lane's token
    assert ng.hist[0, 7].tolist() == 4 and ng.hist[1, 11].tolist() == 6
