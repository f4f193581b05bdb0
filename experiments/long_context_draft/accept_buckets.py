"""Draft acceptance by position bucket (0-1K, 1-2K, 2-4K, 4-8K, 8-16K, 16-32K) on held-out long texts.

Acceptance at entry p: the head's greedy token from (target features at p, token p + 1) equals the target's own
top-1 at p + 1 (the token the target would produce at p + 2); bucketed by p + 2, the drafted token's position.

- ``teacher-forced``: held-out real text (the corpus's ``held`` sequences and its ``text:`` entries); the next token
  is the text's.
- ``generation``: the target continues held-out prefixes of several lengths by itself (greedy, and sampled at
  T = 0.7) for ``--gen`` tokens; acceptance over the generated positions. The head reads only the target's features
  and the tokens before, so teacher-forcing the target's own continuation is exactly its free-running first-token
  acceptance.

CPU at small sizes: ``python experiments/long_context_draft/accept_buckets.py --model-path M.gguf --data D.npz
--heads DIR ... --device cpu --max-len 512``; the H200 runs it at the end of ``train_long.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(os.path.dirname(HERE))]  # this folder and the repository root
from longctx import BUCKETS, Target, bucket_name, head_hidden, load_data, load_head  # noqa: E402


@torch.inference_mode()
def score(target: Target, heads: dict, seqs, start: int = 0, chunk: int = 2048) -> dict:
    """seqs [B, T] -> {head name: {bucket: [hits, n]}} over entries p >= start, plus "target_vs_text" (the target's
    top-1 at p + 1 == token p + 2)."""
    seqs = torch.as_tensor(seqs, device=target.device)
    out = {n: {} for n in list(heads) + ["target_vs_text"]}
    for b in range(seqs.shape[0]):
        s = seqs[b : b + 1]
        aux, hn = target.features(s)
        T = s.shape[1]
        p = torch.arange(start, T - 1, device=target.device)  # entries; the target's logits at p + 1
        tgt = torch.cat([target.logits(hn[0, p[i : i + chunk] + 1]).argmax(-1) for i in range(0, len(p), chunk)])
        emb = target.embed[s[0, 1:]][None]  # token p + 1 for entries 0 .. T - 2
        drafts = {}
        for name, head in heads.items():
            h = head_hidden(
                head, target.spec, aux[:, : T - 1].to(head.w["fc.weight"].dtype), emb.to(head.w["fc.weight"].dtype)
            )[0]
            drafts[name] = torch.cat([head._ids(h[p[i : i + chunk]]) for i in range(0, len(p), chunk)])
        text_next = torch.full_like(tgt, -1)  # the text's token p + 2 (none after the last entry)
        text_next[:-1] = s[0, p[:-1] + 2]
        hits = {n: (drafts[n] == tgt) for n in heads}
        hits["target_vs_text"] = tgt == text_next
        pos = (p + 2).cpu()
        last = torch.zeros_like(pos, dtype=torch.bool)
        last[-1] = True
        for name, hit in hits.items():
            hit = hit.cpu()
            for lo, hi in BUCKETS:
                m = (pos >= lo) & (pos < hi)
                if name == "target_vs_text":
                    m &= ~last
                if m.any():
                    c = out[name].setdefault(bucket_name(lo, hi), [0, 0])
                    c[0] += int(hit[m].sum())
                    c[1] += int(m.sum())
    return out


def merge(a: dict, b: dict) -> dict:
    for name, bk in b.items():
        for k, (h, n) in bk.items():
            c = a.setdefault(name, {}).setdefault(k, [0, 0])
            c[0] += h
            c[1] += n
    return a


def rates(counts: dict) -> dict:
    return {name: {k: {"acceptance": h / n, "positions": n} for k, (h, n) in bk.items()} for name, bk in counts.items()}


def _bucket_prefixes(max_len: int, gen: int, per_bucket: int) -> list[list[int]]:
    """Per bucket up to ``max_len``, ascending: the prefix lengths whose ``gen`` generated tokens land in it,
    ``per_bucket`` of them, each continuation centred in its share of the bucket (one: the bucket's middle); a bucket
    that ``max_len`` cuts ends its last continuation at ``max_len``."""
    out = []
    for lo, hi in BUCKETS:
        if hi <= max_len:
            share = (hi - lo) / per_bucket
            ps = [max(int(lo + (i + 0.5) * share) - gen // 2, 16) for i in range(per_bucket)]
        elif lo < max_len:
            share = (max_len - lo) // per_bucket
            ps = [max_len - gen - i * share for i in range(per_bucket)]
        else:
            continue
        out.append(sorted({p for p in ps if p + gen <= max_len and p > 0}))
    return out


def prefix_lengths(max_len: int, gen: int, per_bucket: int = 1) -> list[int]:
    """The prefix lengths of every bucket (``_bucket_prefixes``), ascending."""
    return sorted({p for ps in _bucket_prefixes(max_len, gen, per_bucket) for p in ps})


def prefix_rounds(max_len: int, gen: int, per_bucket: int = 1) -> list[int]:
    """The same prefix lengths in rounds: each bucket's first, then each bucket's second, and so on."""
    lists, out = _bucket_prefixes(max_len, gen, per_bucket), []
    for i in range(per_bucket):
        out += [ps[i] for ps in lists if i < len(ps) and ps[i] not in out]
    return out


def evaluate(
    target: Target,
    heads: dict,
    data: dict,
    max_len: int,
    gen: int,
    temps=(0.0, 0.7),
    n_gen_seqs: int = 4,
    per_bucket: int = 1,
    teacher_forced: bool = True,
    deadline: float | None = None,
    log=print,
) -> dict:
    """Teacher-forced on the held-out sequences and texts (cut to ``max_len``) and in generation; the generation's
    counts also by prefix length (``generation_by_prefix``: how much one prefix moves a bucket). The prefixes run in
    rounds (every bucket's first, then every bucket's second, ...), and none starts after ``deadline`` (a
    ``time.time()``), so a run cut short still has every bucket; the by-prefix counts say which ran."""
    t0 = time.time()
    res = {"teacher_forced": {}, "generation": {}, "generation_by_prefix": {}}
    held = torch.as_tensor(data["held"][:, :max_len])
    if teacher_forced:
        res["teacher_forced"]["held"] = rates(score(target, heads, held))
        for k in data:
            if k.startswith("text:"):
                res["teacher_forced"][k] = rates(score(target, heads, torch.as_tensor(data[k][None, :max_len])))
        log(f"teacher-forced done, {time.time() - t0:.0f}s")
    for temp in temps if gen > 0 else ():  # gen 0: teacher-forced only
        counts, by_prefix = {}, {}
        for plen in prefix_rounds(max_len, gen, per_bucket):
            if deadline is not None and time.time() > deadline:
                log(f"generation T={temp}: deadline, prefix {plen} and later not run")
                break
            seqs = target.generate(held[:n_gen_seqs, :plen], gen, temp, seed=plen)
            c = score(target, heads, seqs, start=plen - 1)
            by_prefix[str(plen)] = rates(c)
            counts = merge(counts, c)
            log(f"generation T={temp} prefix {plen}: {time.time() - t0:.0f}s")
        res["generation"][f"T={temp:g}"] = rates(counts)
        res["generation_by_prefix"][f"T={temp:g}"] = by_prefix
    return res


def table(res: dict) -> str:
    lines = []
    for mode, sets in res.items():
        if mode == "generation_by_prefix":
            continue
        for set_name, by_head in sets.items():
            bks = sorted({b for h in by_head.values() for b in h}, key=lambda s: int(s.split("-")[0]))
            lines.append(f"{mode} {set_name}: " + "  ".join(bks))
            for name, bk in by_head.items():
                cells = "  ".join(f"{100 * bk[b]['acceptance']:5.1f}" if b in bk else "    -" for b in bks)
                lines.append(f"  {name:>16}  {cells}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--data", required=True, help="train_long.py corpus file (its held-out sequences and texts)")
    ap.add_argument("--heads", nargs="+", required=True, help="head directories (name = the folder's name)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-len", type=int, default=None, help="positions (default: the data's)")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--gen-seqs", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=1, help="generated continuations' prefix lengths a bucket")
    ap.add_argument("--temps", type=float, nargs="+", default=[0.0, 0.7], help="generation temperatures (0: greedy)")
    ap.add_argument("--no-teacher-forced", action="store_true", help="generation only")
    ap.add_argument("--max-seconds", type=float, default=None, help="start no generation after this (see evaluate)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.prefixes < 1 or a.gen_seqs < 1 or any(t < 0 for t in a.temps):
        ap.error("--prefixes and --gen-seqs must be >= 1 and --temps >= 0")
    dt = torch.bfloat16 if a.device != "cpu" else torch.float32
    target = Target(a.model_path, a.device, dt)
    data = load_data(a.data)
    max_len = a.max_len or data["held"].shape[1]
    heads = {os.path.basename(p.rstrip("/")): load_head(p, target.spec, target, dt, a.device, max_len) for p in a.heads}
    t0 = time.time()
    res = evaluate(
        target,
        heads,
        data,
        max_len,
        a.gen,
        temps=a.temps,
        n_gen_seqs=a.gen_seqs,
        per_bucket=a.prefixes,
        teacher_forced=not a.no_teacher_forced,
        deadline=None if a.max_seconds is None else t0 + a.max_seconds,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(table(res))
    if a.out:
        setup = {"gen": a.gen, "gen_seqs": min(a.gen_seqs, len(data["held"])), "prefixes": a.prefixes, "temps": a.temps}
        with open(a.out, "w") as fh:
            json.dump(
                {
                    "heads": list(heads),
                    "max_len": max_len,
                    "setup": setup,
                    "elapsed_s": round(time.time() - t0, 1),
                    "command": " ".join(sys.argv),
                    "results": res,
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
