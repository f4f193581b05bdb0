"""Recorded selected block sets of an executor run (``--record-path``) and their replay at any model shape.

numpy only; no torch. The executor writes the file (``oasis_exec.runner.runner``: ``ExecConfig.record_path``) when the
engine closes; ``selection=replay`` (``ExecConfig.replay_path``) reads it back through :class:`SetReplay`, and the
simulator replays the same file: it is also a valid *selection file* of ``traces/SCHEMA.md`` ("Selected block
sets", ``oasis_core.recording.load_selection``), so one format serves both backends.

File: one ``np.savez_compressed`` archive (``allow_pickle=False``), written atomically (temporary file + rename):

- ``meta``: a JSON string (0-d array): ``format`` ("oasiskv-selected-sets"), ``version`` (1), ``mode``,
  ``selection`` (the run's own source), ``model`` (the ``oasis_core`` spec name, e.g. ``gguf-SmolLM2`` or
  ``qwen3-8b``), ``model_path``, ``n_layers``, ``n_kv_heads``, ``top_k``, ``block_size``, ``fetch_ratio``,
  ``max_context``, ``steps`` (decode steps recorded), ``truncated_steps`` (steps left out once the memory cap was
  reached; 0 normally), ``blocks_of`` (what ``item_nblocks`` counts), optional ``date``, ``commit``, ``device``.
- ``step_sets`` int16 (int32 when ids do not fit) ``[sum_s L * B_s * H, K]``: the predicted sets, step after step;
  step ``s`` holds ``[L, B_s * H, K]`` (layer-major; row ``b * H + h`` = decode item ``b`` of the step, KV head
  ``h``), best first, -1 padded. What a step records is what the mode's prediction chose *during* it: the next
  step's set (``lookahead``: from the draft query; ``proxy``: from the current query), the current step's set
  (``quest``, ``retrieval``). ``dense`` predicts nothing and records no step.
- ``step_batch`` int32 ``[S]``: ``B_s``, the decode items of step ``s``;
- per decode item, in step order then batch order (``sum_s B_s`` entries): ``item_req`` (request id),
  ``item_pos`` (position of the token the step decoded), ``item_nblocks`` (the block count the prediction saw:
  ids ``< item_nblocks - 1`` were eligible; the newest block is the always-resident local block),
  ``item_step`` (the request's own decode-step index, 0 first);
- the schema's selection-file view, for the simulator: ``sets`` ``[S_r, L * H, K]`` (the decode steps of the
  request with the most steps, rows layer-major), ``layers`` (``0 .. L-1``) and ``request`` (its id). Written when
  that request has at least 2 steps. ``oasis_sim`` converts it to its ReplaySets (``oasis_sim.replay``) and
  averages per-row figures, so it replays a SmolLM2 recording at a Qwen3-8B shape as it is (same ``top_k``).

Replay at another shape (:class:`SetReplay`), documented choice:

- **request**: the target run's requests, in admission order, take the recording's requests in first-seen order,
  cyclically (target request ``i`` replays recorded request ``i mod R``);
- **step**: a target request's ``k``-th decode step replays its recorded request's step ``k mod S_r`` (a wrap
  back to step 0 is one burst of churn, every ``S_r`` steps);
- **rows**: target (layer ``l``, KV head ``h``) replays recorded (``l mod L_src``, ``h mod H_src``);
- **columns**: a smaller ``top_k`` keeps the first (best) ``K`` ids -- exactly the top-``K`` of the same scores; a
  larger one tiles the row: copy ``i`` is the recorded set shifted by ``i * span`` blocks (``span``: the recorded
  request's largest block count), so the churn fraction and every overlap fraction stay as recorded;
- **block ids** (``ids``): ``wrap`` (default): an id stays as recorded when the target's context has it
  (``id < eligible``), else it is taken ``mod eligible`` -- identity whenever the target context is at least the
  recorded one, so churn per step (blocks entering the set), step-to-step overlap, cross-head and cross-layer
  overlap (within the recorded heads/layers) are preserved exactly, while absolute positions (where in the
  context the selected blocks lie) are not rescaled; ``scale``: ``floor(id * eligible_target / eligible_recorded)``
  of the same step -- keeps relative positions (sinks at the start, recency at the end) but adds churn whenever
  the two block counts grow at different rates (every block boundary) and merges ids when the target is smaller.
  Ids that collide after mapping keep their first (best) occurrence; the rest become -1 (a smaller set).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
from typing import Optional

import numpy as np

from .echo import show
from .recording import read_npz

FORMAT = "oasiskv-selected-sets"
VERSION = 1
ID_MAPS = ("wrap", "scale")
RECORD_MAX_BYTES = 1 << 30  # in-memory cap on recorded sets (int16 ids); later steps are counted, not kept
BLOCKS_OF = "blocks of the context the prediction saw, the local block included (eligible ids < n - 1)"


class SetRecordError(ValueError):
    """An unreadable or invalid set recording; one line naming the file and the field."""


# -- writing ----------------------------------------------------------------------------------------------------


class SetRecorder:
    """Accumulates per-step sets in host memory (numpy) and writes them once (``write``), atomically.

    ``add_step(sets [L, B*H, K], req_ids, positions, n_blocks)`` per decode step. Past ``max_bytes`` of kept ids
    later steps are only counted (``truncated_steps``) and one message goes to stderr. If the process exits with
    the recorder never written (no ``Engine.close()``), an ``atexit`` hook writes what it holds.
    """

    def __init__(self, path: str, meta: dict, max_bytes: int = RECORD_MAX_BYTES):
        self.path, self.meta, self.max_bytes = str(path), dict(meta), int(max_bytes)
        self.sets, self.batch, self.req, self.pos, self.nb, self.kstep = [], [], [], [], [], []
        self.bytes = 0
        self.truncated = 0
        self.written = False
        self._count = {}  # request id -> decode steps seen
        atexit.register(self._at_exit)

    def add_step(self, sets, req_ids, positions, n_blocks) -> None:
        a = np.asarray(sets)
        if a.ndim != 3:
            raise ValueError(f"SetRecorder.add_step: sets must be [L, B*H, K], got {a.shape}")
        B = len(req_ids)
        H = int(self.meta["n_kv_heads"])
        if a.shape[1] != B * H:
            raise ValueError(f"SetRecorder.add_step: {a.shape[1]} rows for {B} items of {H} heads")
        ks = []
        for r in req_ids:
            ks.append(self._count.get(int(r), 0))
            self._count[int(r)] = ks[-1] + 1
        if self.bytes + a.size * 2 > self.max_bytes:
            if not self.truncated:
                print(
                    f"record {self.path}: stopped keeping sets after {len(self.batch)} steps "
                    f"(the {self.max_bytes:,}-byte cap, oasis_core.setrecord.RECORD_MAX_BYTES); later "
                    "steps are counted in meta.truncated_steps",
                    file=sys.stderr,
                )
            self.truncated += 1
            return
        dt = np.int16 if a.size == 0 or int(a.max()) < 2**15 else np.int32
        self.sets.append(a.reshape(-1, a.shape[2]).astype(dt))
        self.bytes += a.size * np.dtype(dt).itemsize
        self.batch.append(B)
        self.req += [int(r) for r in req_ids]
        self.pos += [int(p) for p in positions]
        self.nb += [int(n) for n in n_blocks]
        self.kstep += ks

    def arrays(self) -> dict:
        K = int(self.meta["top_k"])
        L, H = int(self.meta["n_layers"]), int(self.meta["n_kv_heads"])
        if self.sets:
            wide = any(s.dtype == np.int32 for s in self.sets)
            step_sets = np.concatenate(self.sets).astype(np.int32 if wide else np.int16)
        else:
            step_sets = np.zeros((0, K), dtype=np.int16)
        meta = dict(
            self.meta,
            format=FORMAT,
            version=VERSION,
            steps=len(self.batch),
            truncated_steps=self.truncated,
            blocks_of=BLOCKS_OF,
        )
        out = {
            "meta": np.asarray(json.dumps(meta, sort_keys=True)),
            "step_sets": step_sets,
            "step_batch": np.asarray(self.batch, dtype=np.int32),
            "item_req": np.asarray(self.req, dtype=np.int64),
            "item_pos": np.asarray(self.pos, dtype=np.int32),
            "item_nblocks": np.asarray(self.nb, dtype=np.int32),
            "item_step": np.asarray(self.kstep, dtype=np.int32),
        }
        # The schema's selection-file view: the request with the most steps (first seen among equals).
        if self.req:
            counts = {}
            for r in self.req:  # first-seen order: max() keeps the first of equals
                counts[r] = counts.get(r, 0) + 1
            best = max(counts, key=counts.get)
            rec = SetRecord(out, self.path)
            s = rec.request_sets(best)[0]  # [S_r, L, H, K]
            if s.shape[0] >= 2:
                out["sets"] = s.reshape(s.shape[0], L * H, K).astype(step_sets.dtype)
                out["layers"] = np.arange(L, dtype=np.int32)
                out["request"] = np.asarray(best, dtype=np.int32)
        return out

    def write(self) -> Optional[str]:
        """Write the file (once; later calls do nothing). Returns the path written, or None."""
        if self.written:
            return None
        self.written = True
        atexit.unregister(self._at_exit)
        write_arrays(self.path, self.arrays())
        return self.path

    def _at_exit(self) -> None:
        if not self.written and (self.batch or self.truncated):
            try:
                self.write()
            except Exception as e:  # noqa: BLE001 - nothing to raise to at interpreter exit
                print(f"record {self.path}: not written at exit: {e}", file=sys.stderr)


def write_arrays(path: str, arrays: dict) -> None:
    """``np.savez_compressed`` into ``path`` exactly (no ``.npz`` appended), through a temporary file + rename."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".setrecord-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez_compressed(fh, **arrays)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- reading ----------------------------------------------------------------------------------------------------


class SetRecord:
    """A loaded recording. ``step(s)`` -> (sets [L, B, H, K], req ids, positions, n_blocks);
    ``request_sets(req)`` -> (sets [S_r, L, H, K], n_blocks [S_r]); ``requests`` in first-seen order."""

    def __init__(self, arrays: dict, source: str = "<arrays>"):
        self.source = source
        try:
            self.meta = json.loads(str(arrays["meta"]))
        except (KeyError, ValueError) as e:
            raise SetRecordError(f"{source}: meta: missing or not JSON ({e})") from None
        if self.meta.get("format") != FORMAT:
            raise SetRecordError(f"{source}: meta.format: must be {show(FORMAT)}, got {self.meta.get('format')!r}")
        if self.meta.get("version") != VERSION:
            raise SetRecordError(
                f"{source}: meta.version: must be {VERSION} (the version this reader knows), got "
                f"{self.meta.get('version')!r}"
            )
        for k in ("step_sets", "step_batch", "item_req", "item_pos", "item_nblocks", "item_step"):
            if k not in arrays:
                raise SetRecordError(f"{source}: {k}: missing required array")
        self.L, self.H, self.K = int(self.meta["n_layers"]), int(self.meta["n_kv_heads"]), int(self.meta["top_k"])
        self.step_sets = np.asarray(arrays["step_sets"])
        self.step_batch = np.asarray(arrays["step_batch"], dtype=np.int64)
        self.item_req = np.asarray(arrays["item_req"], dtype=np.int64)
        self.item_pos = np.asarray(arrays["item_pos"], dtype=np.int64)
        self.item_nblocks = np.asarray(arrays["item_nblocks"], dtype=np.int64)
        self.item_step = np.asarray(arrays["item_step"], dtype=np.int64)
        n_items = int(self.step_batch.sum())
        if self.step_sets.ndim != 2 or self.step_sets.shape[1] != self.K:
            raise SetRecordError(
                f"{source}: step_sets: must be [rows, top_k={self.K}], got {list(self.step_sets.shape)}"
            )
        if self.step_sets.shape[0] != n_items * self.L * self.H:
            raise SetRecordError(
                f"{source}: step_sets: must hold L*H rows per decode item "
                f"({n_items} items x {self.L * self.H}), got {self.step_sets.shape[0]}"
            )
        for k in ("item_req", "item_pos", "item_nblocks", "item_step"):
            if getattr(self, k).shape != (n_items,):
                raise SetRecordError(
                    f"{source}: {k}: must have {n_items} entries (sum of step_batch), got {getattr(self, k).shape[0]}"
                )
        # Where each item's rows start: step s begins at L*H*sum(B_<s); item b of step s at that + b*H (per layer
        # the step's rows are B_s*H apart).
        starts = np.concatenate([[0], np.cumsum(self.step_batch)])  # item index of each step's first item
        self._step_first = starts
        self._item_base = np.empty(n_items, dtype=np.int64)
        self._item_stride = np.empty(n_items, dtype=np.int64)
        for s in range(len(self.step_batch)):
            a, b = starts[s], starts[s + 1]
            self._item_base[a:b] = a * self.L * self.H + np.arange(b - a) * self.H
            self._item_stride[a:b] = (b - a) * self.H
        seen = {}
        for i, r in enumerate(self.item_req.tolist()):
            seen.setdefault(r, []).append(i)
        self.requests = list(seen)  # first-seen order
        self._items_of = {r: np.asarray(v, dtype=np.int64) for r, v in seen.items()}
        self._cache = {}

    @property
    def steps(self) -> int:
        return len(self.step_batch)

    def step(self, s: int):
        a, b = self._step_first[s], self._step_first[s + 1]
        B = b - a
        base = a * self.L * self.H
        sets = self.step_sets[base : base + self.L * B * self.H].reshape(self.L, B, self.H, self.K)
        return (
            sets.astype(np.int64),
            self.item_req[a:b].copy(),
            self.item_pos[a:b].copy(),
            self.item_nblocks[a:b].copy(),
        )

    def _item_rows(self, items):
        """Row indices [n, L, H] of ``items`` into ``step_sets``."""
        li = np.arange(self.L)[None, :, None]
        hi = np.arange(self.H)[None, None, :]
        return self._item_base[items][:, None, None] + li * self._item_stride[items][:, None, None] + hi

    def request_sets(self, req: int):
        """(sets [S_r, L, H, K] int64, n_blocks [S_r]) of request ``req``'s decode steps, in order."""
        if req not in self._cache:
            items = self._items_of[int(req)]
            self._cache[req] = (self.step_sets[self._item_rows(items)].astype(np.int64), self.item_nblocks[items])
        return self._cache[req]

    def request_step(self, req: int, k: int):
        """(sets [L, H, K] int64, n_blocks) of request ``req``'s ``k``-th decode step."""
        items = self._items_of[int(req)]
        i = items[k]
        return self.step_sets[self._item_rows(items[k : k + 1])[0]].astype(np.int64), int(self.item_nblocks[i])

    def request_steps(self, req: int) -> int:
        return len(self._items_of[int(req)])


def load_setrecord(path: str) -> SetRecord:
    return SetRecord(read_npz(path, SetRecordError), str(path))


# -- replay at any shape --------------------------------------------------------------------------------------------


def dedup_rows(ids: np.ndarray) -> np.ndarray:
    """Per row, later repeats of an id (>= 0) become -1; the first (best-ranked) occurrence stays."""
    if ids.size == 0:
        return ids
    order = np.argsort(ids, axis=-1, kind="stable")
    srt = np.take_along_axis(ids, order, -1)
    dup = np.zeros_like(srt, dtype=bool)
    dup[..., 1:] = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
    out = ids.copy()
    np.put_along_axis(out, order, np.where(dup, -1, srt), -1)
    return out


def map_columns(sets: np.ndarray, top_k: int, span: int) -> np.ndarray:
    """[..., K_src] -> [..., top_k]: the first ``top_k`` (best) ids, or ``ceil(top_k / K_src)`` copies shifted by
    ``i * span`` blocks, cut to ``top_k``."""
    k_src = sets.shape[-1]
    if top_k <= k_src:
        return sets[..., :top_k]
    reps = -(-top_k // k_src)
    tiles = [np.where(sets >= 0, sets + i * span, -1) for i in range(reps)]
    return np.concatenate(tiles, -1)[..., :top_k]


def map_ids(sets: np.ndarray, eligible_dst, eligible_src=None, ids: str = "wrap") -> np.ndarray:
    """Map block ids to a context of ``eligible_dst`` eligible blocks (broadcast over the leading dims); see the
    module docstring for ``wrap`` and ``scale``. Collisions are removed (``dedup_rows``)."""
    e = np.asarray(eligible_dst, dtype=np.int64)
    if ids == "wrap":
        out = np.where((sets >= 0) & (e > 0), sets % np.maximum(e, 1), -1)
    elif ids == "scale":
        src = np.maximum(np.asarray(eligible_src, dtype=np.int64), 1)
        out = np.where((sets >= 0) & (e > 0), np.minimum(sets * e // src, np.maximum(e - 1, 0)), -1)
    else:
        raise ValueError(f"ids: must be one of {ID_MAPS}, got {show(ids)}")
    return dedup_rows(out)


class SetReplay:
    """Recorded sets for a run of shape (``n_layers``, ``n_kv_heads``, ``top_k``); see the module docstring.

    ``admit(lane)`` when a request takes a lane (the next recorded request, cyclically; its step counter starts at
    0); ``sets(lanes, n_blocks)`` -> int32 ``[B, L, H, K]`` for one decode step of those lanes (each lane's
    counter advances), ``n_blocks[b]`` the block count its prediction sees (eligible ids ``< n_blocks - 1``)."""

    def __init__(self, rec: SetRecord, n_layers: int, n_kv_heads: int, top_k: int, ids: str = "wrap"):
        if ids not in ID_MAPS:
            raise ValueError(f"replay ids: must be one of {ID_MAPS}, got {show(ids)}")
        if not rec.requests:
            raise SetRecordError(f"{rec.source}: holds no recorded step (a dense run records none)")
        self.rec, self.L, self.H, self.K, self.ids = rec, n_layers, n_kv_heads, top_k, ids
        self.li = np.arange(n_layers) % rec.L
        self.hi = np.arange(n_kv_heads) % rec.H
        self._admitted = 0
        self.lane_req, self.lane_step = {}, {}
        self._prep = {}

    def admit(self, lane: int) -> int:
        r = self.rec.requests[self._admitted % len(self.rec.requests)]
        self._admitted += 1
        self.lane_req[lane], self.lane_step[lane] = r, 0
        return r

    def _prepared(self, r):
        """Recorded request ``r`` at this run's rows and columns, once: (sets [S_r, L, H, K] int32, their largest id
        per step [S_r], eligible blocks of each recorded step [S_r])."""
        if r not in self._prep:
            sets, nbs = self.rec.request_sets(r)  # [S_r, L_src, H_src, K_src]
            span = max(int(nbs.max()) - 1, 1)
            cols = map_columns(sets[:, self.li][:, :, self.hi], self.K, span).astype(np.int32)
            self._prep[r] = (np.ascontiguousarray(cols), cols.reshape(cols.shape[0], -1).max(1), nbs - 1)
        return self._prep[r]

    def sets(self, lanes, n_blocks) -> np.ndarray:
        """int32 ``[B, L, H, K]``: one decode step of ``lanes`` (see the class docstring)."""
        out = np.empty((len(lanes), self.L, self.H, self.K), dtype=np.int32)
        for i, (lane, nb) in enumerate(zip(lanes, n_blocks)):
            if lane not in self.lane_req:
                self.admit(lane)
            r = self.lane_req[lane]
            cols, top, elig = self._prepared(r)
            k = self.lane_step[lane] % cols.shape[0]
            self.lane_step[lane] += 1
            e = int(nb) - 1  # eligible blocks of this lane's step
            if self.ids == "wrap" and e > 0 and top[k] < e:
                out[i] = cols[k]  # every id exists in the target context: as recorded
            else:
                out[i] = map_ids(cols[k].astype(np.int64), e, int(elig[k]), self.ids)
        return out


def to_sim_replay(
    rec: SetRecord,
    out_path: str,
    top_k: Optional[int] = None,
    request: Optional[int] = None,
    last_steps: Optional[int] = None,
) -> int:
    """Write one recorded request's sets as the simulator's ReplaySets JSON (``oasis_sim.policy.ReplaySets``:
    every step's set stands for ``true_next``, ``draft`` and ``proxy``, as ``oasis_sim.replay`` converts a
    selection file), columns mapped to ``top_k`` (``map_columns``). Rows: all ``L * H`` of that request
    (``policy_layers = L``). Returns the rows' layers (``L``)."""
    if request is None:
        request = max(rec.requests, key=rec.request_steps)
    sets, nbs = rec.request_sets(request)
    if last_steps:
        sets = sets[-(last_steps + 1) :]
    K = top_k or rec.K
    flat = map_columns(sets, K, max(int(nbs.max()) - 1, 1)).reshape(sets.shape[0], rec.L * rec.H, K)
    if flat.shape[0] < 2:
        raise SetRecordError(f"{rec.source}: request {request}: needs at least 2 recorded steps, has {flat.shape[0]}")
    steps = [{"true_next": s.tolist(), "draft": s.tolist(), "proxy": s.tolist()} for s in flat[1:]]
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"top_k": K, "initial": flat[0].tolist(), "steps": steps}, f)
    return rec.L


def churn_stats(sets: np.ndarray) -> dict:
    """Step statistics of sets ``[S, ..., K]`` (-1 padded): mean blocks entering a row's set per step, and the mean
    step-to-step overlap fraction (|A_t & A_t-1| / |A_t|). A metric for tests and reports, not a policy."""
    s = sets.reshape(sets.shape[0], -1, sets.shape[-1])
    enter, overlap = [], []
    for t in range(1, s.shape[0]):
        for r in range(s.shape[1]):
            a = set(s[t, r][s[t, r] >= 0].tolist())
            b = set(s[t - 1, r][s[t - 1, r] >= 0].tolist())
            enter.append(len(a - b))
            overlap.append(len(a & b) / len(a) if a else 1.0)
    return {
        "entering_per_step": float(np.mean(enter)) if enter else 0.0,
        "overlap": float(np.mean(overlap)) if overlap else 1.0,
    }
