"""Prompt lookup beside the draft head (``ExecConfig.draft_ngram``), on the device: where a lane's last
``draft_ngram`` or more tokens occurred earlier in its context, the token that followed them there replaces the
head's draft.

Prompt lookup gains with context (more text to match) where a trained head loses; on real Gemma 3 270M text at 16K the
two together guessed 75% of the next tokens against the head's 44% and the n-gram's 69% alone
(``experiments/long_context_draft``, ``ngram_attn``). The draft decides only which blocks a lookahead step predicts
and, in a speculative step, the first proposal: outputs stay those of the mode (speculation verifies every draft).

Each lane's tokens live on the device, ``NgramDrafts.hist`` (int32 [max_lanes, max_context + 1], the last column a
sink for writes past the context): the prompt as its chunks are prefilled (``prefill``), then each decode step's
input token at its position (``step``, inside ``ModelExec.decode_core``; a speculative step's in ``Drafts.chain``),
and a speculative step's accepted drafts (``accepted``). ``step`` then looks every lane of the step up
(``lookup``: vectorised over the lanes and the context, static shapes, no host read), so it runs in every step of a
decode chain and inside the step's CUDA graph: chained and unchained steps draft the same. A lane drafts from the
lookup only once its prefill was seen whole (``ok``); a lane prefilled synthetically (the benchmark's) has no
tokens and never does, though the lookup still runs (its cost is the same). Semantics: ``oasis_core.prompt_lookup``'s
``PromptLookup(max_n=max(3, min_match), min_n=min_match).match()``: for ``n = max_n .. min_n`` the latest ``j <
len`` with ``tokens[j - n : j]`` equal to the context's last ``n`` tokens (the suffix's own occurrence does not
count), the draft ``tokens[j]``; with ``ExecConfig.draft_gate`` its probability counts as 1.
"""

from __future__ import annotations

import torch


def lookup(hist, length, max_n: int, min_n: int):
    """Prompt lookup over token histories, on the device (no host read, static shapes: capturable).

    ``hist`` [B, C] int tokens (a row's first ``length[b]`` count; the rest is never read), ``length`` [B] int64.
    Returns (found [B] bool, index [B] int64 of the proposed token in its row, 0 where not found): for ``n = max_n
    .. min_n`` (longest first) the latest ``j`` with ``n <= j < length`` and ``hist[j - n : j] == hist[length - n :
    length]``, as ``PromptLookup.match`` over ``hist[b, : length[b]]``.

    The match of an ``n``-gram is the AND over ``d = 1 .. n`` of ``hist[j - d] == hist[length - d]``, so the
    ``max_n`` shifted comparisons are made once and accumulated: ``max_n`` passes over [B, C]."""
    B, C = hist.shape
    ar = torch.arange(C, device=hist.device)
    m = ar < length[:, None]  # [B, C]: j < length; below, j >= d for every shift d
    best = torch.full((B,), -1, dtype=torch.int64, device=hist.device)
    for d in range(1, max_n + 1):
        last = hist.gather(1, (length - d).clamp(min=0)[:, None])  # [B, 1] the context's d-th token from the end
        m[:, :d] = False
        m[:, d:] &= hist[:, : C - d] == last
        if d >= min_n:  # longer matches come later and win
            j = torch.where(m, ar, -1).amax(1)
            best = torch.where(j >= 0, j, best)
    found = best >= 0
    return found, best.clamp(min=0)


class NgramDrafts:
    def __init__(self, min_match: int, *, max_lanes: int, max_context: int, tok, conf=None):
        if min_match < 1:
            raise ValueError(f"draft_ngram: the shortest match must be >= 1 token, got {min_match}")
        if max_context < 1:
            raise ValueError(f"NgramDrafts: max_context must be >= 1 (a lane's tokens), got {max_context}")
        self.min_n, self.max_n = min_match, max(3, min_match)
        self.tok = tok  # Drafts.tok, each lane's next draft token (device)
        self.conf = conf  # Drafts.conf (ExecConfig.draft_gate) or None: a matched lane's draft counts as certain
        dev = tok.device
        self.C = max_context  # column C: a sink for writes past the context (never read)
        self.hist = torch.zeros(max_lanes, max_context + 1, dtype=torch.int32, device=dev)
        self.ok = torch.zeros(max_lanes, dtype=torch.bool, device=dev)  # the lane's tokens are all in hist
        self.seen: dict[int, int] = {}  # lane -> prompt tokens written so far (host: prefill is eager)
        self._used = torch.zeros((), dtype=torch.int64, device=dev)  # drafts the lookup gave (a device counter)

    @property
    def used(self) -> int:
        """Drafts the lookup gave so far (reads the device)."""
        return int(self._used)

    @property
    def nbytes(self) -> int:
        return self.hist.numel() * self.hist.element_size()

    def admit(self, lane: int) -> None:
        """A new request on ``lane``: no lookup until its prefill is seen whole."""
        self.seen.pop(lane, None)
        self.ok[lane] = False

    def prefill(self, ch) -> None:
        """A real prefill chunk of ``ch.lane``: its tokens into the lane's history; after the last one the lane
        looks up (its sampled token is the first decode step's input, written by ``step``)."""
        lane, n = ch.lane, len(ch.tokens)
        if ch.start == 0:
            self.seen[lane] = 0
        if self.seen.get(lane) != ch.start or ch.start + n > self.C:  # a chunk not seen: the lane stops guessing
            self.seen.pop(lane, None)
            self.ok[lane] = False
            return
        self.hist[lane, ch.start : ch.start + n] = torch.tensor(ch.tokens, dtype=torch.int32, device=self.hist.device)
        self.seen[lane] = ch.start + n
        if ch.last:
            self.ok[lane] = True

    def _write(self, lanes, pos, toks) -> None:
        """``hist[lanes, pos] = toks`` ([B] or [B, n] each; positions past the context go to the sink column)."""
        self.hist[lanes.reshape(-1, *[1] * (pos.dim() - 1)), pos.clamp(0, self.C)] = toks.to(torch.int32)

    def step(self, lanes, toks, pos, look: bool = True) -> None:
        """A decode step's input tokens ``toks`` [B] at ``pos`` [B] of ``lanes`` [B] (device) into the history; with
        ``look``, each lane whose context's suffix matched drafts the token that followed it (``Drafts.tok``, and
        ``Drafts.conf`` 1). On the device only: runs eagerly and under CUDA-graph capture."""
        self._write(lanes, pos, toks)
        if not look:
            return
        found, j = lookup(self.hist[lanes], pos + 1, self.max_n, self.min_n)
        found &= self.ok[lanes]
        tok = self.hist[lanes, j].to(self.tok.dtype)
        self.tok[lanes] = torch.where(found, tok, self.tok[lanes])
        if self.conf is not None:
            self.conf[lanes] = torch.where(found, torch.ones_like(self.conf[lanes]), self.conf[lanes])
        self._used += found.sum()

    def accepted(self, lanes, pos, emitted, n) -> None:
        """After a speculative step at ``pos`` [B]: its ``n`` [B] accepted drafts (``emitted`` [B, k + 1], the first
        ``n`` of a row) at ``pos + 1 ..`` into the history; the token after them is the next step's input."""
        k1 = emitted.shape[1]
        j = torch.arange(k1, device=pos.device)
        at = torch.where(j < n[:, None], pos[:, None] + 1 + j, self.C)  # the rest: the sink column
        self._write(lanes, at, emitted)
