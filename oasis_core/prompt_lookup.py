"""Prompt-lookup (n-gram) draft: a training-free guess of the next token from the context itself.

After the context ``x_0 .. x_t``, find the most recent earlier occurrence of its last ``n`` tokens
(``n = max_n .. min_n``, longest first) and propose the token that followed it; with no match at any ``n``, propose
the last token again (``fallback="last"``) or a fixed id. ``PromptLookup`` keeps one dict per ``n`` (n-gram ->
position of the token that followed its most recent occurrence), so appending a token and proposing are O(max_n):
an engine can keep one per request; ``propose_at`` is the one-shot form for analysis.
"""

from __future__ import annotations

from typing import Iterable, Sequence


class PromptLookup:
    def __init__(self, max_n: int = 3, min_n: int = 1, fallback: str | int = "last"):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"PromptLookup: need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if fallback != "last" and not isinstance(fallback, int):
            raise ValueError(f"PromptLookup.fallback: 'last' or a token id, got {fallback!r}")
        self.max_n, self.min_n, self.fallback = max_n, min_n, fallback
        self.tokens: list[int] = []
        self._next = {n: {} for n in range(min_n, max_n + 1)}  # n -> {n-gram: index of the token after it}

    def extend(self, tokens: Iterable[int]) -> "PromptLookup":
        for tok in tokens:
            j = len(self.tokens)  # index of the token arriving now: it follows the n-grams ending at j - 1
            for n, table in self._next.items():
                if j >= n:
                    table[tuple(self.tokens[j - n : j])] = j
            self.tokens.append(int(tok))
        return self

    def match(self) -> tuple[int, int] | None:
        """(n, index of the proposed token) of the longest match of the context's suffix, or None."""
        t = len(self.tokens)
        for n in range(self.max_n, self.min_n - 1, -1):
            if t >= n:
                j = self._next[n].get(tuple(self.tokens[t - n :]))
                if j is not None:
                    return n, j
        return None

    def propose(self) -> int:
        """The guess of the token after the context (the fallback when nothing matches)."""
        if not self.tokens:
            raise ValueError("PromptLookup.propose: empty context")
        m = self.match()
        if m is not None:
            return self.tokens[m[1]]
        return self.tokens[-1] if self.fallback == "last" else int(self.fallback)


def _at(pl: PromptLookup, tokens: Sequence[int], positions: Iterable[int], read) -> list:
    """``read(pl)`` after ``pl`` has taken ``tokens[: t + 1]``, for each position ``t`` (any order, one pass)."""
    positions = list(positions)
    out = {}
    for t in sorted(set(positions)):
        pl.extend(tokens[len(pl.tokens) : t + 1])
        out[t] = read(pl)
    return [out[t] for t in positions]


def propose_at(
    tokens: Sequence[int], positions: Iterable[int], max_n: int = 3, min_n: int = 1, fallback: str | int = "last"
) -> list[int]:
    """For each position ``t`` (ascending or not), the draft of ``tokens[t + 1]`` from ``tokens[: t + 1]``."""
    return _at(PromptLookup(max_n, min_n, fallback), tokens, positions, PromptLookup.propose)


def match_lengths_at(tokens: Sequence[int], positions: Iterable[int], max_n: int = 3) -> list[int]:
    """For each position ``t``, the length of the longest suffix of ``tokens[: t + 1]`` (at most ``max_n``) that
    occurred earlier, 0 when none did: how much evidence ``propose_at``'s guess has."""
    return _at(PromptLookup(max_n, 1), tokens, positions, lambda pl: (pl.match() or (0,))[0])
