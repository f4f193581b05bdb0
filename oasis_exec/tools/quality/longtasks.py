"""Long-context tasks made offline from real filler text (issue 37): generator and scorer.

Three kinds, each a prompt of exactly ``n_tokens - answer_tokens`` tokens whose answer is a 5-digit number the
model must write after an answer prefix (greedy, ``answer_tokens`` at most):

- ``passkey`` -- one key hidden at a depth of the filler (``DEPTHS``: 10 / 25 / 50 / 75 / 90%); group
  ``passkey@<depth>``;
- ``multikey`` -- ``n_keys`` named keys (``"The pass key for <name> is <key>."``) at spread random depths, one of
  them asked; group ``multikey``;
- ``vartrack`` -- a chain of ``hops`` assignments (``VAR ABCDE = 12345``, ``VAR FGHIJ = VAR ABCDE``, ...) in order
  at random depths, interleaved with a distractor chain of the same length and another value; the question asks the
  value of the chain's last variable; group ``vartrack``.

The filler is ``filler_ids``: the committed evaluation texts (``traces/texts``: three licences and two CPython
modules; none is in the draft heads' training pool, ``oasis_exec.tools.draft_train.corpus_files`` leaves them out)
joined by blank lines, cycled from a per-task offset. A task is stored as *segments* (``("ids", [...])`` or
``("fill", offset, n)``) so a task file holds the filler once (``save_tasks`` / ``load_tasks``: the device needs no
tokenizer to run them). Everything is deterministic given the tokenizer and ``seed``; every number drawn (keys,
values) is absent from the filler text, so the answer appears in the prompt exactly once.

The scorer (``score``): the continuation is decoded and its first maximal run of digits must equal the answer
(exact match; a continuation listing several keys scores on the first). ``contains`` (the answer anywhere in the
continuation) is reported beside it.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass, field

from .texts import TEXTS, encode, token_ids

KINDS = ("passkey", "multikey", "vartrack")
DEPTHS = (0.1, 0.25, 0.5, 0.75, 0.9)
NAMES = ("apple", "river", "copper", "falcon", "meadow", "violet", "harbor", "summit", "lantern", "pebble")
INTRO = {
    "passkey": "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about the important information there.\n\n",
    "multikey": "Several pass keys, each with a name, are hidden inside a lot of irrelevant text. Find them and "
    "memorize them. I will quiz you about one of them.\n\n",
    "vartrack": "Memorize and track the chain of variable assignments hidden in the following text.\n\n",
}
PASSKEY_NEEDLE = "\n\nThe pass key is {key}. Remember it.\n\n"
MULTIKEY_NEEDLE = "\n\nThe pass key for {name} is {key}. Remember it.\n\n"
VAR_VALUE = "\n\nVAR {a} = {value}\n\n"
VAR_COPY = "\n\nVAR {a} = VAR {b}\n\n"
QUESTION = {
    "passkey": ("\n\nWhat is the pass key?", "The pass key is"),
    "multikey": ("\n\nWhat is the pass key for {name}?", "The pass key for {name} is"),
    "vartrack": ("\n\nWhat is the value of VAR {name}?", "The value of VAR {name} is"),
}


@dataclass
class LongTask:
    kind: str
    group: str  # the unit of the dense >= 80% rule: passkey@<depth>, multikey, vartrack
    name: str  # <group>#<trial>
    n_tokens: int  # prompt + answer_tokens
    answer: str
    answer_tokens: int
    segments: list  # ("ids", [..]) | ("fill", offset, n)
    needles: list = field(default_factory=list)  # token index of each inserted statement in the prompt
    info: dict = field(default_factory=dict)

    def prompt(self, filler: list) -> list:
        out = []
        for seg in self.segments:
            if seg[0] == "ids":
                out += list(seg[1])
            else:
                out += cycle(filler, seg[1], seg[2])
        return out


def cycle(filler: list, offset: int, n: int) -> list:
    """``n`` filler tokens from ``offset``, wrapping around."""
    offset %= len(filler)
    reps = -(-(offset + n) // len(filler)) + 1
    return (filler * reps)[offset : offset + n]


def filler_ids(tok, texts=TEXTS) -> list:
    sep = encode(tok, "\n\n")
    out = []
    for name in texts:
        out += token_ids(tok, name) + sep
    return out


def chat_parts(tok) -> tuple[str, str]:
    """(text before the user message, text after it incl. the generation prompt); ("", "") without a chat
    template (a base model: Gemma 3 270M's GGUF has none). The prompt starts with ``bos_ids``."""
    if not getattr(tok, "chat_template", None):
        return "", ""
    mark = "\x00TASK-CONTENT\x00"
    s = tok.apply_chat_template([{"role": "user", "content": mark}], tokenize=False, add_generation_prompt=True)
    a, b = s.split(mark)
    return a, b


def bos_ids(tok) -> list:
    """[BOS] where the tokenizer adds one by itself (Gemma: its prompts must start with it), else []."""
    bos = getattr(tok, "bos_token_id", None)
    try:
        ids = tok.encode("", add_special_tokens=True)
    except TypeError:
        return []
    return [bos] if bos is not None and list(ids)[:1] == [bos] else []


def _draw_numbers(rng: random.Random, n: int, banned_text: str) -> list:
    out = []
    while len(out) < n:
        x = rng.randint(10000, 99999)
        if str(x) not in banned_text and x not in out:
            out.append(x)
    return out


def _names(rng: random.Random, n: int) -> list:
    out = []
    while len(out) < n:
        s = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))
        if s not in out:
            out.append(s)
    return out


def _spread_depths(rng: random.Random, n: int, lo=0.05, hi=0.95) -> list:
    """``n`` sorted depths, one drawn uniformly in each of ``n`` equal slices of [lo, hi]."""
    w = (hi - lo) / n
    return [lo + w * (i + rng.random()) for i in range(n)]


def make_task(tok, kind: str, n_tokens: int, trial: int, *, depth: float | None = None, filler=None,
              filler_text: str | None = None, answer_tokens: int = 16, seed: int = 0, n_keys: int = 4,
              hops: int = 4) -> LongTask:  # fmt: skip
    """One task of ``kind`` whose prompt is exactly ``n_tokens - answer_tokens`` tokens (see the module)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: choose from {', '.join(KINDS)}")
    filler = filler if filler is not None else filler_ids(tok)
    filler_text = filler_text if filler_text is not None else tok.decode(filler)
    tag = f"{kind}@{depth:g}" if kind == "passkey" else kind
    rng = random.Random(f"longtasks/{seed}/{n_tokens}/{tag}/{trial}")
    head, tail = chat_parts(tok)
    info: dict = {}
    if kind == "passkey":
        (key,) = _draw_numbers(rng, 1, filler_text)
        stmts, depths, answer, q = [PASSKEY_NEEDLE.format(key=key)], [depth], str(key), {}
    elif kind == "multikey":
        keys = _draw_numbers(rng, n_keys, filler_text)
        names = rng.sample(NAMES, n_keys)
        depths = _spread_depths(rng, n_keys)
        ask = rng.randrange(n_keys)
        stmts = [MULTIKEY_NEEDLE.format(name=n, key=k) for n, k in zip(names, keys)]
        answer, q = str(keys[ask]), {"name": names[ask]}
        info = {"asked": ask, "names": names, "keys": keys}
    else:
        value, other = _draw_numbers(rng, 2, filler_text)
        names = _names(rng, 2 * hops)
        a, b = names[:hops], names[hops:]
        chain = [VAR_VALUE.format(a=a[0], value=value)] + [VAR_COPY.format(a=a[i], b=a[i - 1]) for i in range(1, hops)]
        decoy = [VAR_VALUE.format(a=b[0], value=other)] + [VAR_COPY.format(a=b[i], b=b[i - 1]) for i in range(1, hops)]
        is_chain = sorted([True] * hops + [False] * hops, key=lambda _: rng.random())  # interleaved, each in order
        ci, di = iter(chain), iter(decoy)
        stmts = [next(ci) if c else next(di) for c in is_chain]
        depths = _spread_depths(rng, 2 * hops)
        answer, q = str(value), {"name": a[-1]}
        info = {"chain": a, "decoy": b, "decoy_value": other, "in_chain": is_chain}
    question, prefix = QUESTION[kind]
    pre = bos_ids(tok) + encode(tok, head + INTRO[kind])
    post = encode(tok, question.format(**q)) + encode(tok, tail or "\n") + encode(tok, prefix.format(**q))
    st_ids = [encode(tok, s) for s in stmts]
    n_fill = n_tokens - answer_tokens - len(pre) - sum(map(len, st_ids)) - len(post)
    if n_fill < 16 * (len(stmts) + 1):
        raise ValueError(f"{kind}: {n_tokens} tokens leave {n_fill} for filler")
    offset = rng.randrange(len(filler))
    segs, needles, at, pos = [("ids", pre)], [], 0, len(pre)
    for d, ids in zip(depths, st_ids):
        cut = max(at, round(d * n_fill))
        if cut > at:
            segs.append(("fill", offset + at, cut - at))
            pos += cut - at
        needles.append(pos)
        segs.append(("ids", ids))
        pos += len(ids)
        at = cut
    segs += [("fill", offset + at, n_fill - at), ("ids", post)]
    info.update(depths=[round(d, 4) for d in depths], n_fill=n_fill, prefix=len(pre), offset=offset)
    return LongTask(kind, tag, f"{tag}#{trial}", n_tokens, answer, answer_tokens, segs, needles, info)


def build_suite(tok, n_tokens: int, *, kinds=KINDS, depths=DEPTHS, trials: int = 5, answer_tokens: int = 16,
                seed: int = 0, n_keys: int = 4, hops: int = 4, filler=None) -> list:  # fmt: skip
    """Every task of one context length: per passkey depth and for each other kind, ``trials`` tasks."""
    filler = filler if filler is not None else filler_ids(tok)
    text = tok.decode(filler)
    out = []
    for kind in kinds:
        for d in depths if kind == "passkey" else (None,):
            for t in range(trials):
                out.append(make_task(tok, kind, n_tokens, t, depth=d, filler=filler, filler_text=text,
                                     answer_tokens=answer_tokens, seed=seed, n_keys=n_keys, hops=hops))  # fmt: skip
    return out


# -- scoring ---------------------------------------------------------------------------------------------------------


def first_number(text: str) -> str | None:
    m = re.search(r"\d+", text)
    return m.group(0) if m else None


def score(answer: str, continuation: str) -> dict:
    """``correct``: the continuation's first run of digits is exactly ``answer``; ``contains``: ``answer`` appears
    in it as a whole number."""
    return {
        "correct": first_number(continuation) == answer,
        "contains": re.search(rf"(?<!\d){re.escape(answer)}(?!\d)", continuation) is not None,
    }


def accuracy_by_group(scored: dict, tasks) -> dict:
    """{group: share correct} of ``scored`` ({task name: {"correct": bool, ...}})."""
    by: dict = {}
    for t in tasks:
        by.setdefault(t.group, []).append(bool(scored[t.name]["correct"]))
    return {g: sum(v) / len(v) for g, v in by.items()}


# -- task files --------------------------------------------------------------------------------------------------------


def save_tasks(path: str, filler: list, suites: dict, meta: dict) -> None:
    """``suites``: {n_tokens: [LongTask]} -> one JSON file with the filler ids once."""
    doc = {"schema": "oasiskv-longtasks", "version": 1, **meta, "filler": filler,
           "suites": {str(n): [asdict(t) for t in ts] for n, ts in suites.items()}}  # fmt: skip
    with open(path, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))


def load_tasks(path: str) -> tuple[list, dict, dict]:
    """-> (filler, {n_tokens: [LongTask]}, meta)."""
    with open(path) as fh:
        doc = json.load(fh)
    suites = {int(n): [LongTask(**t) for t in ts] for n, ts in doc.pop("suites").items()}
    return doc.pop("filler"), suites, doc
