"""Speculative lookahead steps with the next step's prediction beside the verify pass (``ExecConfig.spec_predict =
"beside"``; the policy and its exactness: ``oasis_core.spec_predict``).

``SpecPipeline`` is hooked into the resident working set (``ResidentSet.spec_pipe``; None: the after variant) at
two points:

- ``beside(l, ...)``, in the verification pass once layer ``l`` attended, summarized and wrote back its input token:
  launches layer ``l``'s background stage (``Prefetcher.launch``: the prediction stream, then the copy stream, as
  the ordinary step's) that scores the blocks full at ``p + 1`` for each of the pass's draft queries ``1 .. k``,
  keeps their top-K and scores (the candidates), and plans and copies the candidate of the lane's chosen index
  ``s_hat`` (``P_hat``);
- ``repair(l, ...)``, in ``ResidentSet.commit`` once layer ``l``'s accepted drafts are written (unless no lane's acceptance
  can move its prediction, ``repair_possible`` on the host before the step: then nothing is launched; at ``k = 1``
  that is every step in which no lane is one token short of a block's end): launches a second stage
  of the same layer on the same streams (so it runs after the beside one) that takes the candidate of the accepted
  query index, merges in the block the run filled, if any (its one score, from the summary the commit just wrote),
  and plans ``repair_pred(P_true, P_hat, resident)`` with the same cap: only what the true prediction adds over
  the chosen one is copied. On CUDA (``fused_ops``) that prediction is one ``oasis_kernels.spec_repair`` launch a
  layer (``fused``); its torch chain ``spec_repair_ref`` (the ops of ``oasis_core.spec_predict``, a few dozen launches a
  layer) otherwise.

Both stages are device work only (no host synchronisation), so the speculative step still runs as one CUDA graph
per batch size, draft length and acceptance kind (``DecodeGraphs.spec_step``); ``s_hat`` is a buffer of this object
that the runner fills before each step (``before_step``), which a captured graph reads at replay. On CPU the
stages run inline where they are launched (``Prefetcher.launch``), the same code path, synchronously.

``before_step`` / ``after_step`` (the runner, on the host): each lane's choice from its own acceptance estimate
(``oasis_core.speculation.Acceptance``, reset when another request takes the lane), and the step's count of
lane-steps that needed a repair (``needs_repair`` on the host lists the step's one synchronisation returned):
``stats()``.

Where it does not run (``unsupported``): the host transfer path and UVA copy graphs (their per-layer hand-offs take
one launch a layer a step), an adaptive fetch cap (the repair reuses the step's cap; an adaptive policy would be
asked twice). The runner then keeps the after variant and says why (``SpecStep.predict_used`` / ``predict_reason``).
"""

from __future__ import annotations

import numpy as np
import torch

from oasis_core.spec_predict import (
    choose_query,
    needs_repair,
    repair_possible,
)
from oasis_core.speculation import Acceptance

from .. import ops


def install(cfg, ws, pipe, max_lanes: int) -> tuple:
    """(the spec_predict variant that runs, why not the configured one or None); with ``beside`` running, the
    working set ``ws`` gets its ``SpecPipeline``."""
    if cfg.spec_predict != "beside" or not cfg.spec_max_k:
        return "after", None
    why = unsupported(cfg, pipe)
    if why is not None:
        return "after", why
    ws.spec_pipe = SpecPipeline(parts=ws.p, max_lanes=max_lanes)
    return "beside", None


def unsupported(cfg, pipe) -> str | None:
    """Why ``spec_predict = "beside"`` cannot run with this prefetcher (None: it can)."""
    if pipe is None or not cfg.mode_spec.background:
        return f"mode {cfg.mode} has no background prediction"
    if pipe.cuda and pipe.route.path != "uva":
        return f"transfer path {pipe.route.path}: beside needs the uva path"
    if pipe.ext.copy_graph:
        return "copy_graph: beside needs the copies inside the step's graph"
    if pipe.caps.fixed is None:
        return "an adaptive fetch policy: the repair reuses the step's cap"
    return None


class SpecPipeline:
    def __init__(self, *, parts, max_lanes: int):
        self.me, self.pipe, self.device = parts, parts.pipe, parts.device  # SetParts: the store, selector, sizes
        self.s_hat = torch.ones(max_lanes, dtype=torch.int64, device=self.device)  # the chosen query index a row
        L = parts.L
        self.cand = [None] * L  # layer -> (ids [k, R, K], scores [k, R, K]) of the step's candidates
        self.p_hat = [None] * L  # layer -> the planned candidate [R, K]
        self.est = {}  # lane -> (req_id, Acceptance)
        self.lane_steps = self.repairs = 0
        self.repair_on = True  # this step's repair can fetch (repair_possible); else it is not launched at all
        # the next this many speculative steps run the repair even where it cannot fetch (it then plans nothing): the
        # bench's warm-up sets 2 so that the step's graph with the repair is made (eager, then captured) before the
        # timed steps, not in them. Counted in speculative steps (before_step consumes it), not engine steps, so an
        # ordinary step in the warm-up cannot use it up. (SmolLM2's one slow beside step on the H100, 1dc31ae /
        # 1d44039, was not a late capture: no graph key was new in the timed steps, bench's graphs_new_in_timed)
        self.force_repairs = 0
        # the repair's prediction in one oasis_kernels.spec_repair launch a layer (CUDA with fused_ops; the tests set it
        # on CPU, where the kernel runs in Triton's interpreter); else the torch ops of oasis_core.spec_predict
        self.fused = parts.device.type == "cuda" and parts.cfg.fused_ops

    # -- host side (the runner) ---------------------------------------------------------------------------------

    def before_step(self, items, ks) -> None:
        """Fill ``s_hat`` for the step's batch rows from their lanes' acceptance estimates (``ks``: each lane's draft
        length, the pass verifying ``k = max(ks)``: a lane's drafts past its own accept with rate 0)."""
        k = max(ks)
        rates = np.array(
            [[self._est(it).rate(j) if j < ki else 0.0 for j in range(k)] for it, ki in zip(items, ks)],
            dtype=np.float64,
        )
        self._chosen = choose_query(rates, k)
        self.s_hat[: len(items)].copy_(torch.as_tensor(self._chosen))
        pos = np.array([it.position for it in items])
        forced = self.force_repairs > 0
        self.force_repairs -= forced
        self.repair_on = forced or bool(repair_possible(pos, np.array(ks), self._chosen, k, self.me.bs).any())

    @property
    def graph_key(self) -> bool:
        """What a captured speculative step depends on besides its shape: whether it runs the repair."""
        return self.repair_on

    def after_step(self, items, pos_list, ks, n_acc) -> None:
        """The step's acceptance (host lists): each lane's estimate, and how many lane-steps needed a repair."""
        k = max(ks)
        rep = needs_repair(np.asarray(pos_list), np.asarray(n_acc), self._chosen, k, self.me.bs)
        self.lane_steps += len(items)
        self.repairs += int(rep.sum())
        for it, ki, n in zip(items, ks, n_acc):
            self._est(it).observe(ki, n)

    def _est(self, it) -> Acceptance:
        got = self.est.get(it.lane)
        if got is None or got[0] != it.req_id:
            got = self.est[it.lane] = (it.req_id, Acceptance())
        return got[1]

    def stats(self) -> dict:
        """Lane-steps run beside and those whose acceptance moved the query or filled a block (``needs_repair``:
        their repair plan may fetch; where the filled block does not enter the top-K it fetches nothing)."""
        return {"spec_predict_lane_steps": self.lane_steps, "spec_predict_repairs": self.repairs}

    # -- device side (ModelExec's hooks) ------------------------------------------------------------------------

    def beside(self, l, q, lanes, rows, pos, sets) -> None:
        """Layer ``l``'s candidates and the plan of ``P_hat``, beside the rest of the pass. ``q`` [B, k + 1, Hq, D]:
        the pass's queries; ``pos`` [B]: the input positions."""
        me, H = self.me, self.me.H
        B, k = q.shape[0], q.shape[1] - 1
        R = B * H
        nb = (pos + 1) // me.bs + 1  # blocks full at p + 1 are eligible (the local block at p + 1 is not)
        nb32, lanes32 = nb.to(torch.int32), lanes.to(torch.int32)
        s_hat = self.s_hat[:B]
        given = sets[1][:, l] if sets is not None else None

        def predict():
            ids, vals = [], []
            for s in range(1, k + 1):
                sc = me.selector.scores(l, q[:, s], nb32, lanes32).view(R, -1)
                if given is not None:
                    pred = given.reshape(R, -1)
                    if me.cfg.synthetic_topk:  # the work selection=model does here; its result is not used
                        me.selector.topk(sc, nb)
                else:
                    pred = me.selector.topk(sc, nb)
                pred = pred.long()
                val = torch.where(pred >= 0, sc.gather(1, pred.clamp(min=0)), torch.full_like(sc[:, :1], -torch.inf))
                ids.append(pred)
                vals.append(val)
            ids_t, vals_t = torch.stack(ids), torch.stack(vals)  # [k, R, K]
            self.cand[l] = (ids_t, vals_t)
            p_hat = ids_t[(s_hat - 1).repeat_interleave(H), torch.arange(R, device=q.device)]
            self.p_hat[l] = p_hat
            return p_hat

        self._launch(l, predict, lanes, rows, (q, lanes32, nb, nb32, s_hat, sets))

    def repair(self, l, q, n, pos, lanes, rows, sets, recorded) -> None:
        """Layer ``l``'s repair after the acceptance (``n`` [B] on the device): the true prediction from the
        candidates and the filled block, planned as ``repair_pred`` with the step's cap. With ``fused`` one
        ``oasis_kernels.spec_repair`` launch (the accepted query index, the filled block's score, ``merge_block`` and
        ``repair_pred``, one program a row); else its torch chain ``spec_repair_ref`` scoring through ``ops`` (the same
        ids: tests/unit/test_kernels_spec_repair.py)."""
        if not self.repair_on:  # no lane's acceptance can move its prediction: P_true == P_hat everywhere
            return
        from oasis_kernels.spec_repair import spec_repair, spec_repair_ref

        me, st = self.me, self.me.store
        R = q.shape[0] * me.H
        given = sets[1][:, l].reshape(R, -1) if sets is not None else None

        def predict():
            ids, vals = self.cand[l]
            args = (ids, vals, self.p_hat[l], st.resident[l], self.pipe.row_ids(rows), n, pos, lanes, q, st.kmin[l],
                    st.kmax[l], me.bs, me.cfg.block_score)  # fmt: skip
            if self.fused:
                p_true = torch.empty_like(self.p_hat[l]) if recorded is not None else None
                out = spec_repair(*args, given=given, p_true_out=p_true)
            else:
                out, p_true = spec_repair_ref(*args, given=given, score=ops.block_score)
            if recorded is not None:
                recorded.append(p_true)
            return out

        self._launch(l, predict, lanes, rows, (q, n, pos, given))

    def _launch(self, l, predict, lanes, rows, handed) -> None:
        """``Prefetcher.launch`` of layer ``l`` once the main stream reaches this point (``ResidentSet._launch_prediction``'s
        hand-off: the tensors the prediction stream reads are recorded on it)."""
        pipe, after = self.pipe, None
        if self.device.type == "cuda" and pipe.cuda:
            after = torch.cuda.Event()
            after.record()
            pipe.cross_stream(pipe.s_pred, lanes, *[t for t in handed if t is not None])
        pipe.launch(l, after, predict, lanes, rows)
