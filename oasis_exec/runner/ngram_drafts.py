"""Prompt lookup beside the draft head (``ExecConfig.draft_ngram``): where a lane's last ``draft_ngram`` or more
tokens occurred earlier in its context, the token that followed them there replaces the head's draft.

Prompt lookup gains with context (more text to match) where a trained head loses; on real Gemma 3 270M text at 16K the
two together guessed 75% of the next tokens against the head's 44% and the n-gram's 69% alone
(``experiments/long_context_draft``, ``ngram_attn``). The draft decides only which blocks a lookahead step predicts
and, in a speculative step, the first proposal: outputs stay those of the mode (speculation verifies every draft).

Each lane keeps an ``oasis_core.prompt_lookup.PromptLookup`` of its tokens on the host: the prompt as its chunks are
prefilled, then every token the runner hands back. A step's override is one small host-to-device write of the
matched lanes' tokens into ``Drafts.tok`` before the step runs; the steps inside a decode chain (no host read between
them) keep the head's drafts. A lane prefilled synthetically (the benchmark's) has no tokens and no lookup.
"""

from __future__ import annotations

import torch

from oasis_core.prompt_lookup import PromptLookup


class NgramDrafts:
    def __init__(self, min_match: int, tok, conf=None):
        if min_match < 1:
            raise ValueError(f"draft_ngram: the shortest match must be >= 1 token, got {min_match}")
        self.min_match, self.tok = min_match, tok  # tok: Drafts.tok, each lane's next draft token (device)
        self.conf = conf  # Drafts.conf (ExecConfig.draft_gate) or None: a matched lane's draft counts as certain
        self.lookups: dict[int, PromptLookup] = {}  # lane -> its tokens x_0 .. x_t, t the last handed back
        self.used = 0  # drafts the lookup gave (a counter)

    def admit(self, lane: int) -> None:
        self.lookups.pop(lane, None)

    def prefill(self, ch, tok: int | None) -> None:
        """A real prefill chunk of ``ch.lane`` (its tokens), and after the last one the sampled token ``tok``."""
        if ch.start == 0:
            self.lookups[ch.lane] = PromptLookup(max_n=max(3, self.min_match), min_n=self.min_match)
        pl = self.lookups.get(ch.lane)
        if pl is None or len(pl.tokens) != ch.start:  # a chunk this lookup did not see: it stops guessing
            self.lookups.pop(ch.lane, None)
            return
        pl.extend(ch.tokens)
        if tok is not None:
            pl.extend([tok])

    def override(self, items) -> None:
        """Before a decode step: each item's lane drafts the n-gram's token where its context's suffix matched."""
        lanes, toks = [], []
        for it in items:
            pl = self.lookups.get(it.lane)
            if pl is None:
                continue
            if len(pl.tokens) != it.position + 1 or pl.tokens[-1] != it.token:  # out of step: stop guessing
                del self.lookups[it.lane]
                continue
            m = pl.match()
            if m is not None:
                lanes.append(it.lane)
                toks.append(pl.tokens[m[1]])
        if lanes:
            idx = torch.tensor(lanes, device=self.tok.device)
            self.tok[idx] = torch.tensor(toks, device=self.tok.device)
            if self.conf is not None:
                self.conf[idx] = 1.0
            self.used += len(lanes)

    def emitted(self, items, out: dict) -> None:
        """After a decode call: the tokens it emitted a request (an int, or a list for a chain or a speculative
        step), appended to the lane's lookup."""
        for it in items:
            pl = self.lookups.get(it.lane)
            got = out.get(it.req_id)
            if pl is not None and got is not None:
                pl.extend(got if isinstance(got, list) else [got])
