"""A speculative decode step in the runner (``oasis_exec.runner.speculative``): how many drafts a lane, the draft
chain, the verification pass, the acceptance and the commit, and the counts a benchmark reads.

``SpecStep.choose`` gives each lane's draft length (fixed ``speculative_k``, or ``auto`` from each lane's
acceptance estimate, ``oasis_core.speculation.AdaptiveK``) or None for an ordinary step; ``run`` runs the step.
Greedy and synthetic acceptance run on the device (``ModelExec.spec_core``), as CUDA graphs where the ordinary step
may (``DecodeGraphs.spec_chain`` / ``spec_step``); rows above temperature 0 are verified by rejection sampling on
the host between the pass and the commit (eager). ``steps``, ``tokens``, ``lanes`` and ``accepts`` ((drafts a lane,
accepted) -> lanes: a recording's ``results.accepted_hist``) count what the speculative steps did.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter

import torch

from oasis_core.speculation import AdaptiveK, parse_spec, synthetic_acceptance

from ..config import ATTN_NO_CHAINS, attn_speculative_k
from ..workingset.spec_pipeline import install
from ..workingset.step import rows_index
from .logit_rows import LogitRows
from .speculative import accept, rows_of

SYNTH_ACCEPT_SALT = 0x5A11CE  # the seeded draws of synthetic_accept


class _Clock:
    """Three marks around a speculative step's draft chain and verify pass (``speculative_k auto`` measuring γ):
    CUDA events on a GPU (read after the acceptance has synchronised), the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append(e)
        else:
            self.marks.append(time.perf_counter())

    def spans(self) -> tuple:
        """(seconds of the draft chain, seconds of the verify pass)."""
        a, b, c = self.marks
        if self.cuda:
            return a.elapsed_time(b) / 1e3, b.elapsed_time(c) / 1e3
        return b - a, c - b


class SpecStep:
    def __init__(self, cfg, *, model, graphs, sources, generator, pipe=None, max_lanes: int = 0):
        self.cfg, self.model, self.graphs, self.sources, self.gen = cfg, model, graphs, sources, generator
        # spec_predict (workingset.spec_pipeline): the variant that runs and why not the configured one (or None);
        # beside: the resident set's SpecPipeline (``beside``), else None
        self.predict_used, self.predict_reason = install(cfg, model.ws, pipe, max_lanes)
        self.beside = model.ws.spec_pipe
        # speculative_k auto (oasis_core.speculation): each lane's draft length from its measured acceptance
        self.adaptive = AdaptiveK(cfg.spec_max_k, cfg.speculative_gamma) if cfg.spec_adaptive else None
        # synthetic_accept (benchmark only, dummy weights): accepted drafts drawn, seeded, instead of the target's
        self.synth = synthetic_acceptance(cfg.synthetic_accept) if cfg.synthetic_accept else None
        self.synth_rng = random.Random(cfg.seed ^ SYNTH_ACCEPT_SALT)
        self.steps = self.tokens = self.lanes = 0  # steps run, and the tokens and lanes they emitted / held
        self.accepts = Counter()

    def set_k(self, value) -> None:
        """Another ``speculative_k`` (an int, ``auto``, ``auto:N``) from the next step on, at most the longest the
        runner was built for (its buffers are sized for it; with ``draft_head=attn`` at most 1, ``auto`` meaning
        ``auto:1``). ``auto`` starts a fresh estimate for every lane."""
        if self.cfg.draft_head == "attn":  # k = 1 only: auto is auto:1 (ExecConfig)
            value = attn_speculative_k(value)
        k, adaptive = parse_spec(value, self.cfg.block_size)
        built = self.model.cfg.spec_max_k
        if k > 1 and self.cfg.draft_head == "attn":
            raise ValueError(f"Runner.set_speculative_k: {value!r}: {ATTN_NO_CHAINS}")
        if k > built:
            raise ValueError(f"Runner.set_speculative_k: {value!r} drafts more than the {built} this runner holds")
        self.cfg = dataclasses.replace(self.cfg, speculative_k=value)
        self.adaptive = AdaptiveK(k, self.cfg.speculative_gamma) if adaptive else None

    def admit(self, lane) -> None:
        if self.adaptive is not None:  # a new request on the lane: its acceptance is its own
            self.adaptive.drop(lane)

    def choose(self, items, short, cross):
        """Drafts a lane, or None (the ordinary step) when off, when a lane is short or crossing, or when no lane
        drafts. Fixed ``speculative_k``: the same ``k`` for every lane, fewer when a lane may emit fewer tokens
        (``DecodeItem.max_new``: the batch's least). ``auto``: one length for the step from every lane's estimate
        (``AdaptiveK.choose_batch``), a lane's at most its ``max_new - 1`` (drafts past it count as rejected:
        ``accept``'s ``limits``); now and then an ordinary step, timed (``AdaptiveK.probe_due``)."""
        k = self.cfg.spec_max_k
        if not k or short != "none" or cross:
            return None
        if self.adaptive is None:
            k = max(0, min(k, min(it.max_new for it in items) - 1))
            return [k] * len(items) if k else None
        if self.adaptive.probe_due():  # an ordinary step, timed: the cost speculation is weighed against
            return None
        k = self.adaptive.choose_batch([it.lane for it in items])  # one length: the pass verifies the longest
        ks = [max(0, min(k, it.max_new - 1)) for it in items]
        return ks if max(ks) else None

    def observe_plain(self, items) -> None:
        """An ordinary step under ``auto``: the lanes' acceptance evidence only decays."""
        if self.adaptive is not None:
            for it in items:
                self.adaptive.observe(it.lane, 0, 0)

    def observe_time(self, k: int, seconds: float) -> None:
        """``auto``: a step's wall time, by its draft length (0: an ordinary step)."""
        if self.adaptive is not None:
            self.adaptive.observe_step(k, seconds)

    def run(self, items, params, ks, sets, synth_ready, sampler, recorded):
        """One speculative step of ``items`` (``ks[i]`` drafts for lane ``i``; the chain and the pass run
        ``k = max(ks)`` for all). Returns ({req_id: [emitted tokens]}, last logits {req_id: [V]}, logits of every
        emitted token {req_id: [n, V]})."""
        dev, model = self.model.device, self.model
        k = max(ks)
        lanes_list, lanes, rows, toks, pos = self._inputs(items)
        sampled = self.synth is None and any(sp.temperature > 0 for sp in params)
        graphed = not sampled and self.graphs.ok(lanes_list)
        clock = _Clock(dev) if self.adaptive is not None and k >= 2 else None  # γ: the chain runs k - 1 head steps
        if self.beside is not None:  # spec_predict beside: each lane's chosen query index
            self.beside.before_step(items, ks)
        if clock is not None:
            clock.mark()
        if graphed:
            drafts = self.graphs.spec_chain(len(items), toks, pos, k)
        else:
            drafts = model.drafts.chain(lanes, toks, pos, k)
        if clock is not None:
            clock.mark()
        if sampled:
            logits, aux, step = model.decode_spec(lanes, rows, toks, drafts, pos, sets)
            u_acc, u_draw = self._draws(sampler, [it.req_id for it in items], k + 1, dev)
            n_acc, out = accept(logits, drafts, params, u_acc, u_draw, ks if min(ks) < k else None)
            n_t = torch.tensor(n_acc, device=dev)
            model.commit_spec(step, n_t, sets, recorded)
            emitted = torch.tensor([o + o[-1:] * (k + 1 - len(o)) for o in out], device=dev)  # [B, k + 1]
            model.drafts.resync(lanes, aux, emitted, n_t)
            if model.drafts.ngram is not None:  # the accepted drafts into the lanes' histories (prompt lookup)
                model.drafts.ngram.accepted(lanes, pos, emitted, n_t)
        else:
            lim = torch.tensor(ks, device=dev)
            n_forced = self._forced(ks)
            if graphed:
                logits, n_t, emitted = self.graphs.spec_step(len(items), toks, pos, drafts, lim, n_forced, sets)
            else:
                logits, n_t, emitted = model.spec_core(lanes, rows, toks, pos, drafts, lim, n_forced, sets, recorded)
        if synth_ready is not None:  # the next step's synthetic sets, drawn while the GPU runs this step
            self.sources.presynth(lanes_list, synth_ready)
        if clock is not None:
            clock.mark()
        if not sampled:
            n_acc, out = rows_of(n_t, emitted)  # the step's one host synchronisation
        if self.beside is not None:
            self.beside.after_step(items, [it.position for it in items], ks, n_acc)
        self._count(items, ks, n_acc, out, k, clock)
        ids = [it.req_id for it in items]
        last = LogitRows(ids, lambda i: logits[i, n_acc[i]])
        seq = LogitRows(ids, lambda i: logits[i, : n_acc[i] + 1])
        return {it.req_id: out[i] for i, it in enumerate(items)}, last, seq

    def chain_len(self, items, params, ks, plan_chain, sets, recorded) -> int:
        """Speculative steps this call runs back to back (``ExecConfig.spec_chain``, the engine's share
        ``plan_chain``): 1 unless every row is greedy, the step needs no sets from the host (the model's selection:
        a chain's later positions are known on the device only) and nothing is recorded; at most ``spec_chain_max``
        (1 with beside or adaptive k, whose steps read the host; a chain fills at most one block), every lane drafting
        the same ``k``, and as many steps as the least ``max_new`` allows at ``k + 1`` tokens a step."""
        k = max(ks)
        if (
            plan_chain <= 1
            or self.cfg.spec_chain_max <= 1
            or (self.synth is None and any(sp.temperature > 0 for sp in params))
            or sets is not None
            or recorded is not None
            or min(ks) != k  # lanes drafting different k (run_chain drafts one k for all)
        ):
            return 1
        return max(1, min(plan_chain, self.cfg.spec_chain_max, min(it.max_new for it in items) // (k + 1)))

    def run_chain(self, items, ks, n_chain, synth_ready):
        """``n_chain`` greedy speculative steps of ``items`` back to back (``chain_len``): each step's inputs (the
        token emitted last, the position after the accepted run) are made on the device from the step before,
        one host synchronisation at the end. Returns what ``run`` does, the emitted tokens of all the steps a
        request, and the positions each step began at a lane ([n_chain][B], for the runner's step accounting)."""
        dev, model = self.model.device, self.model
        k = ks[0]
        lanes_list, lanes, rows, toks, pos = self._inputs(items)
        graphed = self.graphs.ok(lanes_list)
        lim = torch.tensor(ks, device=dev)
        steps = []  # (pos, accepted, emitted, logits) a step, on the device
        for i in range(n_chain):
            n_forced = self._forced(ks)
            if graphed:
                drafts = self.graphs.spec_chain(len(items), toks, pos, k)
                logits, n_t, emitted = self.graphs.spec_step(len(items), toks, pos, drafts, lim, n_forced, None)
            else:
                drafts = model.drafts.chain(lanes, toks, pos, k)
                logits, n_t, emitted = model.spec_core(lanes, rows, toks, pos, drafts, lim, n_forced, None, None)
            if i == 0 and synth_ready is not None:
                self.sources.presynth(lanes_list, synth_ready)
            n_t, emitted = n_t.clone(), emitted.clone()  # a graph's outputs are overwritten by the next replay
            steps.append((pos, n_t, emitted, logits.clone()))
            toks = emitted.gather(1, n_t[:, None]).squeeze(1)  # the next step's input: the token emitted last
            pos = pos + n_t + 1
        pos_all, n_all, em_all = (torch.stack([st[j] for st in steps]) for j in range(3))
        pos_l, n_l, em_l = pos_all.tolist(), n_all.tolist(), em_all.tolist()  # the chain's one synchronisation
        out = [[] for _ in items]
        for i in range(n_chain):
            n_acc = n_l[i]
            emitted_rows = [row[: m + 1] for row, m in zip(em_l[i], n_acc)]
            self._count(items, ks, n_acc, emitted_rows, k, None)
            for b, row in enumerate(emitted_rows):
                out[b] += row
        ids = [it.req_id for it in items]
        last_logits, last_n = steps[-1][3], n_l[-1]
        last = LogitRows(ids, lambda b: last_logits[b, last_n[b]])
        seq = LogitRows(ids, lambda b: torch.cat([st[3][b, : n_l[i][b] + 1] for i, st in enumerate(steps)]))
        return {it.req_id: out[b] for b, it in enumerate(items)}, last, seq, pos_l

    def _inputs(self, items):
        """A step's lanes (host list and device tensor), KV rows, input tokens and positions."""
        dev = self.model.device
        lanes_list = [it.lane for it in items]
        lanes = torch.tensor(lanes_list, device=dev)
        toks = torch.tensor([it.token for it in items], device=dev)
        pos = torch.tensor([it.position for it in items], device=dev)
        return lanes_list, lanes, rows_index(lanes_list, self.model.H), toks, pos

    def _forced(self, ks):
        """Benchmark only (``synthetic_accept``, dummy weights): each lane's accepted drafts drawn, not the target's
        verdict, [B] on the device; None otherwise."""
        if self.synth is None:
            return None
        return torch.tensor([self.synth.draw(ki, self.synth_rng.random) for ki in ks], device=self.model.device)

    def _draws(self, sampler, req_ids, n, dev):
        """The acceptance and draw uniforms [B, n] each: the call's sampler's (per-request keyed) when it has them,
        else from the runner's generator."""
        draws = getattr(sampler, "draws", None)
        if draws is not None:
            return draws(req_ids, n)
        u_acc = torch.rand(len(req_ids), n, generator=self.gen, device=dev, dtype=torch.float64)
        u_draw = torch.rand(len(req_ids), n, generator=self.gen, device=dev, dtype=torch.float64)
        return u_acc, u_draw

    def _count(self, items, ks, n_acc, out, k, clock) -> None:
        if clock is not None:  # synchronised: the marks' times are known
            chain_s, verify_s = clock.spans()
            self.adaptive.observe_cost(chain_s / (k - 1), verify_s)
        for it, ki, n in zip(items, ks, n_acc):
            self.accepts[ki, n] += 1
            if self.adaptive is not None:
                self.adaptive.observe(it.lane, ki, n)
        self.steps += 1
        self.lanes += len(items)
        self.tokens += sum(len(o) for o in out)
