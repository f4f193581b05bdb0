"""The draft head's state in the runner: each lane's next draft token (``tok``), and what proposes it.

A lookahead step reads ``tok`` as the draft row's input; a speculative step drafts ``k`` tokens from it
(``chain``). After a step has sampled, ``propose`` (or ``propose_prefill`` after a prefill) writes each lane's next
draft token from the target's features (``aux``); after a speculative step ``resync`` does, from the target's
features at the accepted positions. The single-key head chains on its own hidden state (``h``, kept only when
speculative decoding is on); an attending head (``oasis_exec.model.draft_attn``) keeps its own K/V of every
position, drafts no chain (speculation at k = 1 only: its one draft is ``tok``) and, after a speculative step,
appends every accepted position to its K/V (``AttnDraftHead.propose_accepted``).
"""

from __future__ import annotations

import torch

from .ngram_drafts import NgramDrafts


class Drafts:
    def __init__(
        self,
        head,
        *,
        max_lanes: int,
        hidden: int,
        speculative: bool,
        dtype,
        device,
        ngram: int = 0,
        gate=False,
        max_context: int = 0,
    ):
        self.head = head  # the draft head (None: the mode does not draft); the quality harness may replace it
        self.device = device
        self.tok = torch.zeros(max_lanes, dtype=torch.int64, device=device)
        # ExecConfig.draft_gate: each lane's probability of its draft under the head (prompt lookup's: 1), else None
        self.conf = torch.ones(max_lanes, dtype=torch.float32, device=device) if gate and head is not None else None
        if self.conf is not None:
            head.want_conf = True
        # prompt lookup beside the head (ExecConfig.draft_ngram; runner/ngram_drafts.py: each lane's tokens on the
        # device, max_lanes x (max_context + 1) int32), None when off
        self.ngram = (
            NgramDrafts(ngram, max_lanes=max_lanes, max_context=max_context, tok=self.tok, conf=self.conf)
            if ngram
            else None
        )
        self.attends = getattr(head, "attends", False)  # an attending head: K/V of every position, no chains
        self.h = (
            torch.zeros(max_lanes, hidden, dtype=dtype, device=device) if speculative and not self.attends else None
        )
        if self.attends:
            head.allocate(max_lanes)

    @property
    def layers(self) -> tuple:
        """The target layers whose outputs the head reads (none without a head)."""
        return self.head.layers if self.head is not None else ()

    def reset(self, a) -> None:
        """A synthesized prefill of admission ``a``: no draft yet (with the gate: probability 0, so its first step
        predicts from the current query, not by the lane's last occupant's probability); an attending head's K/V
        filled likewise."""
        self.tok[a.lane] = 0
        if self.conf is not None:
            self.conf[a.lane] = 0.0
        if self.attends:
            self.head.synthesize(a.lane, a.prompt_len - 1, a.seed)

    def propose_prefill(self, lane: int, aux, tok) -> None:
        """The draft token of ``lane`` after its prefill's sampled token ``tok`` [1] (``aux``: the prefill's)."""
        feats = torch.cat([aux[i] for i in self.head.layers])[None]
        if self.attends:
            self.tok[lane] = self.head.propose_lanes([lane], feats, tok)[0]
        elif self.h is not None:
            d, h = self.head.propose_state(feats, tok)
            self.tok[lane], self.h[lane] = d[0], h[0].to(self.h.dtype)
        else:
            self.tok[lane] = self.head.propose(feats, tok)[0]
        self._keep_conf(lane)

    def propose(self, lanes, aux, tok) -> None:
        """The draft tokens of a step's lanes (a list, or a device tensor: no host copy, capturable) after its
        sampled tokens ``tok`` [B] (``aux``: the step's features)."""
        idx = lanes if torch.is_tensor(lanes) else torch.tensor(lanes, device=self.device)
        if self.attends:
            self.tok[idx] = self.head.propose_lanes(idx, aux, tok)
        elif self.h is not None:
            d, h = self.head.propose_state(aux, tok)
            self.tok[idx], self.h[idx] = d, h.to(self.h.dtype)
        else:
            self.tok[idx] = self.head.propose(aux, tok)
        self._keep_conf(idx)

    def _keep_conf(self, idx) -> None:
        """The proposing lanes' draft probabilities (``ExecConfig.draft_gate``); a head that gives none (the quality
        harness's oracle and n-gram stand-ins) counts as certain."""
        if self.conf is not None:
            c = getattr(self.head, "conf", None)
            self.conf[idx] = 1.0 if c is None else c

    def resync(self, lanes, aux, emitted, acc) -> None:
        """The next draft tokens after a speculative step (on the device, capturable): ``aux`` [B, k + 1, 3h] the
        verify pass's features, ``emitted`` [B, k + 1] the tokens emitted after each of its positions (a row's first
        ``acc + 1`` count), ``acc`` [B] int64 the drafts each lane accepted. The single-key head proposes from the
        features at the last accepted position and the token emitted last; an attending head first appends every
        accepted position to its K/V (``AttnDraftHead.propose_accepted``; a rejected draft's position never enters)."""
        if not self.attends:
            ar = torch.arange(acc.shape[0], device=acc.device)
            self.propose(lanes, aux[ar, acc], emitted[ar, acc])
            return
        idx = lanes if torch.is_tensor(lanes) else torch.tensor(lanes, device=self.device)
        self.tok[idx] = self.head.propose_accepted(idx, aux, emitted, acc)
        self._keep_conf(idx)

    def chain(self, lanes, toks, pos, k: int):
        """The ``k`` drafts [B, k] of a speculative step at positions ``pos + 1 .. pos + k`` (``toks`` [B] at
        ``pos``): the draft token proposed after the previous step (prompt lookup's where it matched:
        ``NgramDrafts.step``, which also writes ``toks`` into the lanes' histories), then ``k - 1`` steps of the head
        on its own hidden state (``DraftHead.chain``). An attending head drafts the first only (``ExecConfig``
        refuses k >= 2 with it)."""
        if self.ngram is not None:
            self.ngram.step(lanes, toks, pos)
        d = self.tok[lanes]
        if k == 1:
            return d[:, None]
        if self.attends:
            raise ValueError(f"Drafts.chain: an attending draft head drafts no chains (k = 1 only), asked for k = {k}")
        out = [d]
        h = self.h[lanes]
        for _ in range(k - 1):
            d, h = self.head.chain(h, d)
            out.append(d)
        return torch.stack(out, 1)
