"""Where a decode step's selected block ids come from when not from the model's own scores, and where they go.

``SelectionSources`` holds the runner's three non-model selection paths (``ExecConfig.selection``, ``record_path``):

- ``synthetic``: sets drawn by ``oasis_core.synthetic.SyntheticSelection`` for every (lane, layer, head) row; on
  CUDA the next step's sets are drawn on a side stream while the GPU runs this step (``presynth``), or, with
  ``ExecConfig.synthetic_ahead`` N, N steps' sets are drawn at the first step of a lane set and taken one a step
  (the same sets: the generator's draws do not depend on the steps' outputs);
- ``replay``: sets recorded by another run (``oasis_core.setrecord``), mapped to this run's shape;
- ``record``: this run's predicted sets, kept on the host and written once when the engine closes (``save``).

``sets(lanes, positions)`` returns the step's triple [3, B, L, H, K] (current, next-step draft, next-step proxy:
the mode reads its own) or None when the model's scores choose.
"""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger(__name__)


class SelectionSources:
    def __init__(self, *, cfg, mode, store, shape, device, n_layers: int, n_kv_heads: int, top_k: int, block_size: int):
        self.cfg, self.mode, self.store, self.shape, self.device = cfg, mode, store, shape, device
        self.L, self.H, self.K, self.bs = n_layers, n_kv_heads, top_k, block_size
        self.synth = None  # (lanes tuple, SyntheticSelection)
        self._s_synth, self._pre_synth = None, None  # next step's synthetic sets, drawn during this step (CUDA)
        self._ahead = None  # synthetic_ahead: (lanes tuple, list of the steps' sets drawn ahead, int32, in order)
        self.replay = None
        if cfg.selection == "replay":
            from oasis_core.setrecord import SetReplay, load_setrecord

            self.replay = SetReplay(load_setrecord(cfg.replay_path), n_layers, n_kv_heads, top_k, cfg.replay_ids)
        self.record = self._recorder() if cfg.record_path else None

    def admit(self, lane: int) -> None:
        if self.replay is not None:
            self.replay.admit(lane)

    def sets(self, lanes_list, pos_list):
        """(sets [3, B, L, H, K] or None, event once they were drawn on CUDA or None)."""
        if not self.mode.selects:
            return None, None
        if self.cfg.selection == "synthetic":
            sets = self._ahead_take(lanes_list, pos_list)
            if sets is not None:  # drawn before the run: nothing to draw beside this step (no ready event)
                return sets, None
            sets = self._presynth_take(lanes_list)
            if sets is None:
                sets = torch.stack(self._synthetic_sets(lanes_list, [p // self.bs + 1 for p in pos_list]))
            ready = None
            if self.device.type == "cuda":
                ready = torch.cuda.Event()
                ready.record()
            return sets, ready
        if self.replay is not None:
            return self._replay_sets(lanes_list, pos_list), None
        return None, None

    def _ahead_take(self, lanes_list, pos_list):
        """This step's sets from those drawn ahead (``synthetic_ahead``), or None. At the first step of a lane set
        the N steps' sets are drawn at once (the generator is then N steps on: past them each step draws its own);
        a new lane set drops what is left and draws its own N."""
        n = self.cfg.synthetic_ahead
        if not n:
            return None
        key = tuple(lanes_list)
        if self._ahead is None or self._ahead[0] != key:
            nb = [p // self.bs + 1 for p in pos_list]
            drawn = [torch.stack(self._synthetic_sets(lanes_list, nb)).to(torch.int32) for _ in range(n)]
            self._ahead = (key, drawn[::-1])  # popped from the end
            self._pre_synth = None
        left = self._ahead[1]
        if not left:
            return None
        return left.pop().long()

    def skip(self):
        """A step that selects nothing (every lane short): no sets; any drawn ahead for it are dropped, so the next
        selecting step draws its own. Returns None (the step's sets)."""
        self._pre_synth = None
        return None

    def add_record(self, recorded, req_ids, pos_list) -> None:
        """Keep one step's predicted sets (a list of [B * H, K] tensors, one per prediction) for ``save``."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # lookahead / proxy predict on the side stream
        nb = [self._pred_blocks(p) for p in pos_list]
        self.record.add_step(torch.stack(recorded).cpu().numpy(), req_ids, pos_list, nb)

    def _synthetic_sets(self, lanes_list, n_blocks):
        """Per-step sets from ``oasis_core.synthetic`` for the rows (lane, layer, head): (current, next-step draft,
        next-step proxy), each [B, L, H, K]."""
        from oasis_core.synthetic import SyntheticSelection
        from oasis_core.synthetic_presets import resolve

        key = tuple(lanes_list)
        if self.synth is None or self.synth[0] != key:
            B = len(lanes_list)
            nb = torch.tensor(n_blocks, device=self.device).repeat_interleave(self.L * self.H)
            params = resolve(self.cfg.synthetic)
            gen = SyntheticSelection(
                B * self.L * self.H, nb, self.K, params, self.cfg.seed, layers=self.L, kv_heads=self.H, like=nb
            )
            self.synth = (key, gen)
            if self.cfg.sparse:  # start from the process's current sets: no cold-start transient
                cur = gen.current().view(B, self.L, self.H, self.K)[:, list(self.store.layers)]  # held layers
                for i, lane in enumerate(lanes_list):
                    rows = slice(lane * self.H, (lane + 1) * self.H)
                    # the first K of the row's slots (a hot cache, hisparse, has more: they start empty)
                    self.store.resident[:, rows] = -1
                    self.store.last_sel[:, rows] = -1
                    self.store.resident[:, rows, : self.K] = cur[i]
                    self.store.last_sel[:, rows, : self.K] = 0
        gen = self.synth[1]
        B = len(lanes_list)
        cur = gen.current().view(B, self.L, self.H, self.K)
        nxt = gen.step()
        return cur, nxt.draft.view(B, self.L, self.H, self.K), nxt.proxy.view(B, self.L, self.H, self.K)

    def presynth(self, lanes_list, after) -> None:
        """Draw the next step's synthetic sets now, on a side stream, while the GPU runs this step.

        The generator advances exactly as it would at the next step's start (its draws do not depend on the step's
        outputs), so the sets are the same; only the host time of its ~90 small launches leaves the critical path.
        ``after``: an event recorded once this step's sets were drawn (the generator's last use on the main stream).
        """
        if self._s_synth is None:
            self._s_synth = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._s_synth):
            self._s_synth.wait_event(after)
            nxt = torch.stack(self._synthetic_sets(lanes_list, None))
            done = torch.cuda.Event()
            done.record()
        self._pre_synth = (tuple(lanes_list), nxt, done)

    def _presynth_take(self, lanes_list):
        """The sets ``presynth`` drew for these lanes (None when there are none or the lanes changed)."""
        pre, self._pre_synth = self._pre_synth, None
        if pre is None or pre[0] != tuple(lanes_list) or self.synth is None or self.synth[0] != pre[0]:
            return None
        main = torch.cuda.current_stream()
        main.wait_event(pre[2])
        pre[1].record_stream(main)
        return pre[1]

    def _recorder(self):
        from oasis_core.provenance import commit
        from oasis_core.setrecord import SetRecorder

        c = self.cfg
        meta = {
            "mode": c.mode,
            "selection": c.selection,
            "model": self.shape.name,
            "model_path": c.model_path,
            "n_layers": self.L,
            "n_kv_heads": self.H,
            "top_k": self.K,
            "block_size": self.bs,
            "fetch_ratio": c.fetch_ratio,
            "max_context": c.max_context,
            "dtype": c.dtype,
            "device": str(self.device),
            "seed": c.seed,
            "commit": commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return SetRecorder(c.record_path, meta)

    def _pred_blocks(self, pos: int) -> int:
        """The block count the mode's prediction sees at a decode step of position ``pos``: the next step's
        (lookahead, proxy) or the current one's (quest, retrieval)."""
        return (pos + 1) // self.bs + 1 if self.mode.attends_next_block else pos // self.bs + 1

    def _replay_sets(self, lanes_list, pos_list):
        """The replayed sets of this step as the synthetic source's triple [3, B, L, H, K] (current, lookahead,
        proxy: the mode reads its own; all three are the recorded set)."""
        nb = [self._pred_blocks(p) for p in pos_list]
        s = torch.from_numpy(self.replay.sets(lanes_list, nb)).to(self.device).long()
        return s[None].expand(3, *s.shape)

    def save(self) -> None:
        """Write the recorded sets (once; ``close`` calls it)."""
        if self.record is not None:
            path = self.record.write()
            if path:
                log.info(
                    "record: %s sets of %d decode steps -> %s", self.record.meta["mode"], len(self.record.batch), path
                )
