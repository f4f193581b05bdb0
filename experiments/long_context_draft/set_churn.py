"""Churn and returns of top-K sets (issue 37): why a synthetic preset's savings differ from a run's real ones.

For each run of ``save_sets`` npz files (``gemma_slots.py``) and each K, over the true sets T_{t0} .. T_{t0+P} of
every row (one KV head of each full layer): the blocks entering a row's set a step (share of K), and of those, the
share that was in the set d = 2 .. ``--max-depth`` steps earlier (the most recent such d; counted from step
``--max-depth`` on, where every depth exists: with 16 positions and depth 8, the late half the fetches are taken over) -- the returns a victim cache of S - K slots turns into savings. The same figures of the generator
under ``--preset`` at each run's geometry (3 rows, N / 16 blocks, K, P steps; the draft it replays; ``--seeds``).

    D=experiments/long_context_draft/data
    python experiments/long_context_draft/set_churn.py $D/gemma_topk_sets.npz $D/gemma_topk_sets_held?_32k.npz \
        --n 32768 --max-depth 8 --out experiments/long_context_draft/results/gemma_set_churn_32k_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(HERE)), HERE]

from gemma_slots import BS, EXP, cpu_name, load_sets, runs  # noqa: E402

from oasis_core import provenance  # noqa: E402
from oasis_core.synthetic import SyntheticSelection  # noqa: E402
from oasis_core.synthetic_presets import resolve  # noqa: E402


def churn(seq: np.ndarray, depths=(2, 3, 4)) -> dict:
    """seq [R, T, K] block ids -> {"enter": blocks entering a row's set a step / K ("enter_late": the second half
    of the steps, as the fetches), "return_d": share of the
    entering blocks (step >= max depth) last in the set d steps earlier, "return_any": their sum}."""
    rows, steps, k = seq.shape
    enter, late, back, counted = [], [], dict.fromkeys(depths, 0), 0
    for r in range(rows):
        sets = [set(s.tolist()) for s in seq[r]]
        for t in range(1, steps):
            new = sets[t] - sets[t - 1]
            enter.append(len(new) / k)
            if t - 1 >= (steps - 1) // 2:
                late.append(len(new) / k)
            if t < max(depths):
                continue
            counted += len(new)
            for b in new:
                d = next((d for d in depths if b in sets[t - d]), None)
                if d is not None:
                    back[d] += 1
    out = {"enter": float(np.mean(enter)), "enter_late": float(np.mean(late))}
    out.update({f"return_{d}": back[d] / max(counted, 1) for d in depths})
    out["return_any"] = sum(back.values()) / max(counted, 1)
    return out


def synthetic_sets(params, n_blocks: int, k: int, steps: int, seed: int, rows: int = 3) -> np.ndarray:
    """[rows, steps + 1, K]: the generator's initial set and the drafts it replays (``synthetic_fetch``'s)."""
    sel = SyntheticSelection(rows, n_blocks, k, params, seed, layers=rows, kv_heads=1)
    seq = [np.asarray(sel.current())] + [np.asarray(sel.step().draft) for _ in range(steps)]
    return np.stack(seq, axis=1)


def describe(c: dict) -> str:
    ds = sorted(int(key.split("_")[1]) for key in c if key.split("_")[-1].isdigit())
    backs = " / ".join(f"{100 * c[f'return_{d}']:4.1f}" for d in ds)
    return f"enter {100 * c['enter']:4.1f}% of K (late {100 * c['enter_late']:4.1f}%), back after {ds[0]}..{ds[-1]} steps {backs} (all {100 * c['return_any']:4.1f}%)"


def mean_of(docs: list) -> dict:
    return {key: float(np.mean([d[key] for d in docs])) for key in docs[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sets", nargs="+", help="save_sets npz files")
    ap.add_argument("--n", type=int, default=None, help="only the runs of this context length")
    ap.add_argument("--preset", default="gemma3")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--max-depth", type=int, default=4, help="returns counted up to this many steps back")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    params, rows, synth = resolve({"preset": a.preset}), [], {}
    depths = tuple(range(2, a.max_depth + 1))
    for path in a.sets:
        for n, p_ in runs(path):
            if a.n not in (None, n):
                continue
            ts, by_k = load_sets(path, n, p_)
            for k, s in by_k.items():
                real = churn(s["seq"], depths)
                geo = (-(-n // BS), k, len(ts))
                if geo not in synth:
                    synth[geo] = mean_of([churn(synthetic_sets(params, *geo, seed), depths) for seed in range(a.seeds)])
                rows.append({"sets": os.path.basename(path), "n_tokens": n, "k": k, "real": real,
                             "synthetic": synth[geo]})  # fmt: skip
                print(f"{os.path.basename(path):30s} n={n} K={k:<4} real {describe(real)} | {a.preset} "
                      f"{describe(synth[geo])}")  # fmt: skip
    if a.out:
        doc = {"what": "churn (blocks entering a row's top-K set a step, share of K) and returns (share of them in the "
               "set d steps earlier) of real Gemma 3 270M sets (full layers 5/11/17) vs the generator",
               "preset": a.preset, "seeds": a.seeds, "depths": list(depths), "block_size": BS,
               "weights": "real (gemma-3-270m-q4_k_m.gguf, fp32 on the CPU) for the sets",
               "selection_source": "real attention (min/max summaries), committed top-K sets; generator for synthetic",
               "draft": "correct token, dense view (T_{t+1}); the generator's draft",
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "commit": provenance.commit(dirty_paths=["oasis_core", f"{EXP}/set_churn.py", f"{EXP}/gemma_slots.py", f"{EXP}/data"]),
               "device": f"cpu ({cpu_name()}, {os.cpu_count()} cores)", "rows": rows}  # fmt: skip
        with open(a.out, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
