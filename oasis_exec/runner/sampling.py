"""Token sampling: greedy, temperature and nucleus (top_p), with per-request counter-based randomness.

A request's n-th output token is drawn by inverse-CDF sampling with one uniform number ``u = uniform(key, n)``,
where ``key`` is the request's seed. ``u`` depends on nothing but (seed, n): not on the batch the request shares,
its lane, other requests' draws or the order of steps, so a seeded request yields the same tokens alone or in any
batch (given the same logits), and no per-request generator state has to be kept or freed.
"""

from __future__ import annotations

import torch

_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def request_key(seed: int | None, engine_seed: int, req_id: int) -> int:
    """The random key of a request: its own seed, else one derived from the engine seed and its id."""
    if seed is not None:
        return _mix64(int(seed) & _M64)
    return _mix64(_mix64((int(engine_seed) & _M64) ^ 0x5EED) ^ (int(req_id) & _M64))


def uniform(key: int, index: int) -> float:
    """The uniform draw in [0, 1) for output token ``index`` of the request with ``key``."""
    return (_mix64(key ^ _mix64(int(index) & _M64)) >> 11) * 2.0**-53


def sample(logits: torch.Tensor, params, draws) -> torch.Tensor:
    """logits [B, V]; params: one object with ``temperature`` and ``top_p`` a row; draws: one uniform in [0, 1) a
    row (rows with temperature 0 ignore theirs). Returns the token ids [B] (int64, on the logits' device)."""
    greedy = logits.argmax(-1)
    hot = [i for i, sp in enumerate(params) if sp.temperature > 0]
    if not hot:
        return greedy
    dev = logits.device
    rows = torch.tensor(hot, device=dev)
    temps = torch.tensor([params[i].temperature for i in hot], dtype=torch.float64, device=dev)[:, None]
    probs = torch.softmax(logits[rows].double() / temps, -1)
    p_sorted, order = probs.sort(dim=-1, descending=True, stable=True)
    top_p = [float(getattr(params[i], "top_p", 1.0)) for i in hot]
    if any(p < 1.0 for p in top_p):
        tp = torch.tensor(top_p, dtype=torch.float64, device=dev)[:, None]
        before = p_sorted.cumsum(-1) - p_sorted  # mass of the tokens ranked above: the first is always kept
        p_sorted = torch.where(before < tp, p_sorted, torch.zeros_like(p_sorted))
    cdf = p_sorted.cumsum(-1)
    u = torch.tensor([draws[i] for i in hot], dtype=torch.float64, device=dev)[:, None] * cdf[:, -1:]
    pick = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
    out = greedy.clone()
    out[rows] = order.gather(-1, pick)[:, 0]
    return out


class TemperatureSampler:
    """The runner's sampler for calls that carry none (``RunnerCall.sampler``): greedy rows (temperature 0) and temperature draws
    from one shared ``generator`` (no top_p, no per-request seeds). Called as ``sampler(logits [rows, V],
    sampling params a row) -> token ids [rows]``."""

    def __init__(self, *, generator: torch.Generator):
        self.generator = generator

    def __call__(self, logits, sampling):
        temps = [sp.temperature for sp in sampling]
        greedy = logits.argmax(-1)
        if all(t == 0 for t in temps):
            return greedy
        t = torch.tensor([max(x, 1e-6) for x in temps], device=logits.device)[:, None]
        probs = torch.softmax(logits / t, -1)
        drawn = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        hot = torch.tensor([x > 0 for x in temps], device=logits.device)
        return torch.where(hot, drawn, greedy)
