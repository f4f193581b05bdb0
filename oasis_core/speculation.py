"""Adaptive speculation length: the draft length ``k`` of each request chosen online from its measured acceptance
(issue 18). Standard library only; the executor (``oasis_exec.runner.runner``) and the simulator (``oasis_sim.engine``) use
it unchanged.

**The speed identity** (issue 18): a step drafting ``k`` tokens, each accepted at rate ``α``, whose draft costs
``γ`` of a target step per token, runs ``S = (αk + 1) / (kγ + 1)`` times as fast as ordinary decoding; longer drafts
pay only while ``α`` exceeds ``γ``. The drafts here are a *chain* (draft ``j`` only counts when drafts ``1 .. j - 1``
were accepted), so with a per-position acceptance probability ``α`` the tokens a step emits are, in expectation,

    E(k) = 1 + α + α² + ... + α^k = (1 - α^(k+1)) / (1 - α)          (k + 1 at α = 1)

and the speed-up of drafting ``k`` is ``S(k) = E(k) / (kγ + 1)``: the identity with ``αk`` replaced by the chain's
expected accepted drafts ``E(k) - 1``. ``best_k`` returns the ``k`` in ``[0, k_max]`` of the largest ``S(k)`` (the
smallest such ``k`` on a tie). Its first step is the issue's rule: ``S(1) > S(0)`` exactly when ``α > γ``; a
further draft ``k -> k + 1`` pays when ``α^(k+1) (kγ + 1) > γ E(k)``, so that ``k`` grows with ``α`` and shrinks
with ``γ`` (``α = 1``: ``k_max`` whenever ``γ < 1``).

**The estimate of α** (``Acceptance``, one per request): decayed counts of the positions tried and accepted. A step
drafting ``k`` and accepting ``n`` tried ``n + 1`` positions (the rejected one included) when ``n < k``, else ``k``,
and accepted ``n``: the chain's maximum-likelihood ``α`` is accepted / tried. Both counts decay by ``decay`` every
step (drafting or not) and the estimate is shrunk to a prior,

    α̂ = (prior · weight + accepted) / (weight + tried),

so that a request whose drafts stopped paying (``k = 0``: nothing tried) drifts back to the prior and probes again
when the prior exceeds ``γ`` (its evidence never weighs more than ``1 / (1 - decay)`` steps).

**Per position** (what ``AdaptiveK.choose`` uses): the same counts are kept for each draft position ``j`` (tried:
the steps that reached it; accepted: those that accepted it), ``α̂_j`` shrunk to the prior alike, and the chain's
expected tokens are ``E(k) = 1 + α̂_1 + α̂_1 α̂_2 + ... + α̂_1 ⋯ α̂_k``: the pooled ``α̂`` above when every position
accepts alike. A real draft head does not: SmolLM2's trained head had its first draft accepted 71% of the time at
4K and its later ones almost never (CPU, 2026-12-01, ``experiments/speculative_decoding``), where the pooled ``α̂``
of 0.5 made ``auto`` draft 2–3 tokens and lose to ``k = 1``; per position it drafts 1.

**γ** (``AdaptiveK``): configured, or measured by the caller (``observe_cost``: the seconds of one draft-head step
against one verification pass, an exponentially weighted mean of the steps measured).

**Measured step costs** (``AdaptiveK.observe_step``, unless γ is configured): ``kγ + 1`` prices the verification
pass as independent of ``k``, which the H200 runs of 2026-12-01 refute (SmolLM2 × 16 at 4K, graphed steps: dense
2.0 / 2.5 / 3.2 / 3.6 ms for k = 0 .. 3, lookahead 3.0 / 5.6 / 6.2 / 6.4 ms; ``auto`` drafted 2–3 and ran at
0.71–0.92× where k = 1 gave 1.30× in dense). So the caller also reports each step's seconds with the draft length it
ran (0: an ordinary step), kept as an exponentially weighted mean per ``k`` after ``STEP_SKIP`` samples (the first
steps of a length compile kernels and capture graphs); once ``k`` and 0 both have a mean, the cost of drafting
``k`` is their ratio ``T(k) / T(0)``, else ``kγ + 1``. ``choose`` maximises ``E(k) / cost(k)``. So that ``T(0)``
is known, ``probe_due`` asks the caller for an ordinary step until ``STEP_SKIP + 1`` were timed and then once every
``PROBE_EVERY`` steps (an ordinary step emits ~1/1.4 of a speculative one's tokens here: ~0.5% of throughput).

**Drawn acceptance** (the simulator, ``ChainAcceptance``): the accepted drafts of a ``k``-draft step are the leading
successes of ``k`` draws, draft ``j + 1`` accepted with probability ``rates[j]`` (every rate ``α``: the chain model;
from a measured histogram: ``position_rates``). The executor draws from one too, with dummy weights only
(``ExecConfig.synthetic_accept``, ``synthetic_acceptance``): a benchmark of the speculative step's cost and commit
path at a model shape whose random draft head would accept nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .echo import show

AUTO = "auto"
DEFAULT_MAX_K = 4  # "auto" without ":N": the longest draft, clipped to block_size - 1 by the configs
DEFAULT_GAMMA = 0.1  # γ before any measurement: an EAGLE head (one layer + its LM head) of a 30-40 layer target
PRIOR_ALPHA = 0.6
PRIOR_WEIGHT = 2.0
DECAY = 0.95
GAMMA_EWMA = 0.2  # weight of a new γ measurement
STEP_EWMA = 0.2  # weight of a new step-time measurement (observe_step)
STEP_SKIP = 2  # the first samples of a draft length not kept: kernels compile, CUDA graphs are captured
PROBE_EVERY = 64  # measured costs: an ordinary step at least once in this many steps, so T(0) stays measured

SPEC_HELP = "an integer >= 0, auto or auto:N"


def parse_spec(value, block_size: int | None = None) -> tuple[int, bool]:
    """``(k_max, adaptive)`` of a ``speculative_k`` value: an int ``k >= 0`` (fixed; 0 off), ``"auto"`` (adaptive up
    to ``DEFAULT_MAX_K``, clipped to ``block_size - 1``) or ``"auto:N"`` (adaptive up to ``N >= 1``). Raises
    ``ValueError`` with the rule broken (the caller names the field)."""
    if isinstance(value, bool):
        raise ValueError(f"must be {SPEC_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must be an integer >= 0")
        return value, False
    if not isinstance(value, str):
        raise ValueError(f"must be {SPEC_HELP}")
    head, sep, tail = value.partition(":")
    if head != AUTO:
        raise ValueError(f"must be {SPEC_HELP}")
    if not sep:
        k = DEFAULT_MAX_K if block_size is None else min(DEFAULT_MAX_K, block_size - 1)
        if k < 1:
            raise ValueError(f"auto needs block_size >= 2 (drafts < block_size), block_size is {block_size}")
        return k, True
    try:
        k = int(tail)
    except ValueError:
        raise ValueError(f"must be {SPEC_HELP} (N an integer >= 1)") from None
    if k < 1:
        raise ValueError(f"must be {SPEC_HELP} (N an integer >= 1)")
    return k, True


class SpeculativeFields:
    """What both backends' configs (``ExecConfig``, ``SimConfig``: fields ``speculative_k``, ``block_size``,
    ``spec_chain`` and ``spec_predict``) derive from ``speculative_k`` (``parse_spec``)."""

    @property
    def spec_max_k(self) -> int:
        """The most drafts a speculative step takes: ``speculative_k``, or auto's ``N`` (0: off)."""
        return parse_spec(self.speculative_k, self.block_size)[0]

    @property
    def spec_adaptive(self) -> bool:
        """``speculative_k`` is ``auto``: the draft length is chosen per request each step."""
        return parse_spec(self.speculative_k, self.block_size)[1]

    @property
    def spec_chain_max(self) -> int:
        """The longest chain of speculative steps (``spec_chain``) a config runs: up to ``block_size // (k + 1)``
        (k the longest draft: a chain fills at most one block); 1 without speculative decoding, with adaptive k (each
        step's k reads the host) or with ``spec_predict`` beside (its choice and repair read the host every step)."""
        k, adaptive = parse_spec(self.speculative_k, self.block_size)
        if not k or adaptive or self.spec_predict != "after":
            return 1
        return max(1, min(self.spec_chain, self.block_size // (k + 1)))


def cli_value(text: str):
    """The argparse ``type`` of ``--speculative-k``: an int, ``auto`` or ``auto:N`` (else a one-line error)."""
    import argparse

    t = text.strip()
    try:
        return int(t)
    except ValueError:
        pass
    try:
        parse_spec(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {SPEC_HELP}, got {show(text)}") from None
    return t


cli_value.__name__ = "K"


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens a chain step of ``k`` drafts emits at per-position acceptance ``alpha``:
    ``(1 - α^(k+1)) / (1 - α)`` (``k + 1`` at ``α = 1``)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def chain_expected_tokens(rate, k: int) -> float:
    """``E(k) = 1 + r(0) + r(0) r(1) + ... + r(0) ⋯ r(k - 1)`` for per-position acceptance rates ``rate(j)``."""
    e, p = 1.0, 1.0
    for j in range(k):
        p *= rate(j)
        e += p
    return e


def speedup(alpha: float, k: int, gamma: float) -> float:
    """``S(k) = E(k) / (kγ + 1)``: tokens a step per target-step cost, against ordinary decoding's 1."""
    return expected_tokens(alpha, k) / (k * gamma + 1.0)


def best_k(alpha: float, gamma: float, k_max: int) -> int:
    """The ``k`` in ``[0, k_max]`` of the largest ``speedup(alpha, k, gamma)``; the smallest on a tie (within
    1e-12 relative)."""
    alpha = min(max(float(alpha), 0.0), 1.0)
    return best_k_of(lambda k: expected_tokens(alpha, k), gamma, k_max)


def best_k_of(expected, gamma: float, k_max: int, cost=None) -> int:
    """The ``k`` in ``[0, k_max]`` of the largest ``expected(k) / cost(k)`` (``expected``: a chain's expected
    tokens a step, ``expected(0) = 1``; ``cost``: a step drafting ``k`` against an ordinary one, default
    ``kγ + 1``); the smallest on a tie (within 1e-12 relative)."""
    gamma = max(float(gamma), 0.0)
    if cost is None:
        cost = lambda k: k * gamma + 1.0  # noqa: E731
    best, best_s = 0, 1.0
    for k in range(1, k_max + 1):
        s = expected(k) / cost(k)
        if s > best_s * (1.0 + 1e-12):
            best, best_s = k, s
    return best


@dataclass
class Acceptance:
    """One request's running estimate of the per-position acceptance probability (see the module docstring)."""

    prior: float = PRIOR_ALPHA
    weight: float = PRIOR_WEIGHT
    decay: float = DECAY
    pos_accepted: list = field(default_factory=list)  # per draft position j = 0, 1, ..: decayed counts
    pos_tried: list = field(default_factory=list)

    def observe(self, drafted: int, accepted: int) -> None:
        """One step of the request: ``drafted`` drafts (0: an ordinary step, only the decay), ``accepted`` of them."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"Acceptance.observe: accepted must be in [0, {drafted}], got {accepted}")
        d = self.decay
        self.pos_accepted[:] = [a * d for a in self.pos_accepted]
        self.pos_tried[:] = [t * d for t in self.pos_tried]
        if drafted:
            reached = accepted + (1 if accepted < drafted else 0)  # positions tried: the accepted, then the rejected
            grow = drafted - len(self.pos_tried)
            if grow > 0:
                self.pos_tried += [0.0] * grow
                self.pos_accepted += [0.0] * grow
            for j in range(reached):
                self.pos_tried[j] += 1.0
            for j in range(accepted):
                self.pos_accepted[j] += 1.0

    @property
    def accepted(self) -> float:
        """Decayed accepted drafts over every position (each position's counts decay alike)."""
        return sum(self.pos_accepted)

    @property
    def tried(self) -> float:
        """Decayed positions tried over every position."""
        return sum(self.pos_tried)

    @property
    def alpha(self) -> float:
        """The pooled estimate: every position alike."""
        return (self.prior * self.weight + self.accepted) / (self.weight + self.tried)

    def rate(self, j: int) -> float:
        """``α̂`` of draft position ``j`` (0-based): P(draft ``j + 1`` accepted | drafts ``1 .. j`` accepted),
        shrunk to the prior as ``alpha`` (the prior alone at a position no step has reached)."""
        a = self.pos_accepted[j] if j < len(self.pos_accepted) else 0.0
        t = self.pos_tried[j] if j < len(self.pos_tried) else 0.0
        return (self.prior * self.weight + a) / (self.weight + t)

    def expected_tokens(self, k: int) -> float:
        """``E(k) = 1 + α̂_1 + α̂_1 α̂_2 + ...``: the per-position chain's expected tokens a ``k``-draft step."""
        return chain_expected_tokens(self.rate, k)


class AdaptiveK:
    """Draft lengths from per-request estimates: ``choose(key)`` is ``best_k_of(key's per-position E(k), γ, k_max,
    cost)``, ``choose_batch(keys)`` the one length of a step over several (what the executor and the simulator use);
    ``observe(key, drafted, accepted)`` after each of its steps; ``drop(key)`` when it ends (or its slot is reused).
    ``gamma``: a fixed γ (costs ``kγ + 1`` always), or None to follow ``observe_cost`` (``DEFAULT_GAMMA`` until
    the first measurement) and ``observe_step`` (``cost``)."""

    def __init__(self, k_max: int, gamma: float | None = None, *, prior: float = PRIOR_ALPHA):
        if not isinstance(k_max, int) or k_max < 0:
            raise ValueError(f"AdaptiveK.k_max: must be an integer >= 0, got {show(k_max)}")
        if gamma is not None and not (math.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"AdaptiveK.gamma: must be a finite number >= 0 or None, got {show(gamma)}")
        self.k_max = k_max
        self.fixed_gamma = gamma is not None
        self.gamma = float(gamma) if gamma is not None else DEFAULT_GAMMA
        self.gamma_samples = 0
        self.prior = prior
        self.states: dict = {}
        self.step_s: dict = {}  # draft length -> weighted mean seconds of a step that ran it (0: ordinary)
        self.step_n: dict = {}  # draft length -> steps reported
        self.since_ordinary = 0  # speculative steps reported since the last ordinary one

    def state(self, key) -> Acceptance:
        s = self.states.get(key)
        if s is None:
            s = self.states[key] = Acceptance(prior=self.prior)
        return s

    def choose(self, key) -> int:
        """The draft length for ``key`` alone: ``choose_batch([key])``."""
        return self.choose_batch([key])

    def choose_batch(self, keys) -> int:
        """One draft length for a step over ``keys``: the ``k`` of the largest mean ``E_key(k)`` over ``cost(k)``.
        The pass verifies the step's longest draft for every row and the step pays for it, so a key drafting less
        than the step's ``k`` saves nothing and forgoes its tokens: one length a step, from every key's estimate."""
        ests = [self.state(key).expected_tokens for key in keys]
        if not ests:
            return 0
        return best_k_of(lambda k: sum(e(k) for e in ests) / len(ests), self.gamma, self.k_max, self.cost)

    def cost(self, k: int) -> float:
        """A step drafting ``k`` against an ordinary step: ``T(k) / T(0)`` when both were measured
        (``observe_step``) and γ is not fixed, else ``kγ + 1``."""
        if k == 0:
            return 1.0
        t0, tk = self.step_s.get(0), self.step_s.get(k)
        if self.fixed_gamma or t0 is None or tk is None:
            return k * self.gamma + 1.0
        return tk / t0

    def probe_due(self) -> bool:
        """Whether the next step should be an ordinary one, to measure ``T(0)`` (never with a fixed γ): until
        ``STEP_SKIP + 1`` ordinary steps were reported, then after ``PROBE_EVERY`` speculative ones in a row."""
        if self.fixed_gamma:
            return False
        return self.step_n.get(0, 0) <= STEP_SKIP or self.since_ordinary >= PROBE_EVERY

    def observe_step(self, k: int, seconds: float) -> None:
        """A step that ran draft length ``k`` (the batch's longest; 0: an ordinary step) took ``seconds``. The
        first ``STEP_SKIP`` of each ``k`` are not kept; non-positive times are ignored."""
        if not seconds > 0:
            return
        self.since_ordinary = 0 if k == 0 else self.since_ordinary + 1
        n = self.step_n[k] = self.step_n.get(k, 0) + 1
        if n <= STEP_SKIP:
            return
        prev = self.step_s.get(k)
        self.step_s[k] = seconds if prev is None else (1 - STEP_EWMA) * prev + STEP_EWMA * seconds

    def observe(self, key, drafted: int, accepted: int) -> None:
        self.state(key).observe(drafted, accepted)

    def drop(self, key) -> None:
        self.states.pop(key, None)

    def observe_cost(self, draft_step_s: float, verify_s: float) -> None:
        """A measured step: ``draft_step_s`` seconds a draft-head step, ``verify_s`` the verification pass. Ignored
        with a fixed γ or a non-positive time."""
        if self.fixed_gamma or not (verify_s > 0 and draft_step_s >= 0):
            return
        g = draft_step_s / verify_s
        self.gamma = g if not self.gamma_samples else (1 - GAMMA_EWMA) * self.gamma + GAMMA_EWMA * g
        self.gamma_samples += 1


def position_rates(hist) -> tuple:
    """``(rates, pooled)`` of a measured acceptance ``{k: [steps accepting 0 .. k drafts]}`` (keys int or str):
    ``rates[j]`` = P(draft ``j + 1`` accepted | drafts ``1 .. j`` accepted) = steps accepting more than ``j`` / steps
    that tried draft ``j + 1`` (drafted more than ``j`` and accepted at least ``j``), for every position some step
    tried; ``pooled`` = accepted / tried over all positions (``Acceptance``'s estimate without prior), for the
    positions past them. A chain drawn with these rates reproduces the histogram of each measured length."""
    rows = {int(k): list(v) for k, v in hist.items()}
    longest = max(rows)
    rates = []
    acc_all = tried_all = 0
    for j in range(longest):
        tried = sum(c for k, v in rows.items() if k > j for n, c in enumerate(v) if n >= j)
        acc = sum(c for k, v in rows.items() if k > j for n, c in enumerate(v) if n > j)
        if not tried:
            break
        rates.append(acc / tried)
        acc_all += acc
        tried_all += tried
    return tuple(rates), (acc_all / tried_all if tried_all else 0.0)


class ChainAcceptance:
    """Accepted drafts of a chain step drawn per position: ``rates`` (position ``j``'s acceptance probability;
    positions past them take ``tail``). ``ChainAcceptance.constant(α)`` is the chain model, ``from_hist(h)`` the
    measured one."""

    def __init__(self, rates=(), tail: float = 0.0):
        self.rates = tuple(float(r) for r in rates)
        self.tail = float(tail)

    @classmethod
    def constant(cls, alpha: float) -> "ChainAcceptance":
        return cls((), alpha)

    @classmethod
    def from_hist(cls, hist) -> "ChainAcceptance":
        rates, pooled = position_rates(hist)
        return cls(rates, pooled)

    def rate(self, j: int) -> float:
        return self.rates[j] if j < len(self.rates) else self.tail

    def draw(self, k: int, random) -> int:
        """Accepted drafts of ``k`` (``random()``: uniform in [0, 1), called once per position tried)."""
        n = 0
        while n < k and random() < self.rate(n):
            n += 1
        return n

    def expected_tokens(self, k: int) -> float:
        """``E(k)``: 1 + the expected accepted drafts of ``k``."""
        return chain_expected_tokens(self.rate, k)


def synthetic_acceptance(spec) -> ChainAcceptance:
    """The ``ChainAcceptance`` of an ``ExecConfig.synthetic_accept`` value (a dict, as JSON on the command line):
    ``{"alpha": A}`` (the chain model, every position accepted with probability ``A`` in [0, 1]), ``{"hist": H}``
    or ``H`` itself, a measured histogram ``{"k": [steps accepting 0 .. k drafts]}`` (a bench record's
    ``accepted_hist``; ``ChainAcceptance.from_hist``). Raises ``ValueError`` naming what is wrong."""
    if not isinstance(spec, dict) or not spec:
        raise ValueError('must be {"alpha": A}, {"hist": {"k": [counts]}} or a histogram {"k": [counts]}')
    if "alpha" in spec:
        a = spec["alpha"]
        if set(spec) != {"alpha"} or isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1:
            raise ValueError('{"alpha": A} takes one number A in [0, 1] and nothing else')
        return ChainAcceptance.constant(float(a))
    hist = spec["hist"] if set(spec) == {"hist"} else spec
    if not isinstance(hist, dict) or not hist:
        raise ValueError('"hist" must be a histogram {"k": [steps accepting 0 .. k drafts]}')
    for k, v in hist.items():
        if not str(k).isdigit() or int(k) < 1:
            raise ValueError(f"histogram key {show(k)}: must be a draft length >= 1")
        if (
            not isinstance(v, list)
            or len(v) != int(k) + 1
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in v)
        ):
            raise ValueError(f"histogram {show(k)}: must be {int(k) + 1} counts >= 0 (steps accepting 0 .. {k} drafts)")
    if not sum(sum(v) for v in hist.values()):
        raise ValueError("histogram: every count is 0")
    return ChainAcceptance.from_hist(hist)
