"""The simulator's pipelined speculative lookahead step (``SimConfig.spec_predict``; the executor's
``oasis_exec.workingset.spec_pipeline``, the policy ``oasis_core.spec_predict``).

``after`` (the engine's model before this): the verify pass, then every full layer's prediction and selection and
its copy, the prediction one layer ahead of its copy (``after_tail_s``).

**The commit** (both variants; op ``spec_commit``, ``predictor.spec_commit_kernels``): after the acceptance the
executor's resident set scatters each full layer's accepted drafts' K/V (a rejected one to the trash slot), updates
the summaries (one at k = 1, two past it) and writes back a filled block (``oasis_exec.workingset.commit.commit_accepted``), on the compute stream,
layer by layer; each layer's side stage (after's prediction, beside's repair) is launched once that layer's commit
is done. So the work after the pass is a three-stage pipeline over the full layers -- commit (compute stream), side
work (prediction stream), copy (copy path) -- of ``(n - 1) · max(stages) + sum(stages)`` (``pipelined_s``). In
``after`` the commit (~18 µs a layer at k = 1, ~33 at k = 2) is shorter than the prediction and selection it feeds, so it adds one stage's
fill; in ``beside`` the repair is shorter than the commit, so the commit sets the tail, and a step that launches no
repair still runs it (``commit_tail_s``).

``beside``: the step's side work runs beside the pass as in an ordinary lookahead step (``LayerWork.background``:
per full layer the prediction of the ``K`` candidates, ``K`` scorings and top-Ks, then the selection, then the copy
of the step's fetches on the copy path, layer-local sync with the next step; the side stream's HBM traffic and the
gather's SM share charged to the pass as the ordinary step's; what the beside stage launches beyond the ordinary
step's -- the candidates' score values, two stacks, the chosen index's gather, ~17 small kernels a layer -- taken
from each full layer's pass, op ``spec_beside``), and after the acceptance the repair: every full
layer's repair prediction (op ``spec_repair``, a fixed cost a layer: ``RooflineParams.spec_repair_fixed_s`` says
its source) and second selection (run for every row: the GPU's shapes are fixed), then the copies of the requests
whose acceptance needs it (``repair_tail_s``); none of it in a step where no request's acceptance could move its
prediction (``repair_on``: at ``k = 1``, no request one token short of a block's end), as the executor skips it. Which requests do (``repaired``): ``oasis_core.spec_predict.needs_repair``
of their drawn acceptance and position, the chosen query index from the acceptance model's own rates (what a
lane's converged estimate picks). **Assumption** (no sets are simulated here): a repaired request fetches what one
step's drift fetches, its policy's fetches of this step again (the true position's prediction against the chosen
one's differs like the predictions of neighbouring steps). The executor's repairs are measured
(``spec_predict_repairs`` in a bench record); with synthetic selection they copy nothing there.

Nothing here imports ``oasis_exec``.
"""

from __future__ import annotations

import numpy as np

from oasis_core.spec_predict import choose_query, needs_repair, repair_possible


def chosen_index(rate, k: int) -> int:
    """The query index the beside prediction uses for ``k`` drafts under per-position rates ``rate(j)``."""
    return int(choose_query(np.array([[rate(j) for j in range(k)]], dtype=np.float64), k)[0])


def repaired(positions, accepted, k: int, s_hat: int, block_size: int) -> list:
    """Per request (input position, accepted drafts of a ``k``-draft step): whether its beside prediction needs a
    repair."""
    if not positions:
        return []
    rep = needs_repair(np.asarray(positions), np.asarray(accepted), np.full(len(positions), s_hat), k, block_size)
    return rep.tolist()


def repair_on(positions, ks, k: int, s_hat: int, block_size: int) -> bool:
    """Whether the step launches its repair: some request's acceptance could move its prediction
    (``oasis_core.spec_predict.repair_possible``, decided before the step, as the executor)."""
    if not positions:
        return False
    n = len(positions)
    got = repair_possible(np.asarray(positions), np.asarray(ks), np.full(n, s_hat), k, block_size)
    return bool(got.any())


def pipelined_s(n_layers: int, *stages: float) -> float:
    """``n_layers`` items through stages in sequence, one item a stage at a time, each stage's item ``l`` waiting for
    the previous stage's item ``l`` and its own item ``l - 1``, every item of a stage taking the same time: the
    slowest stage ``n_layers - 1`` times after one pass through all of them, ``(n - 1) · max + sum`` (zero-length
    stages leave it; none: 0)."""
    st = [s for s in stages if s > 0]
    if not st or n_layers <= 0:
        return 0.0
    return (n_layers - 1) * max(st) + sum(st)


def after_tail_s(n_layers: int, side_s: float, xfer_s: float, commit_s: float = 0.0) -> float:
    """After the pass, layer by layer: each layer's masked commit (``commit_s``, compute stream), then its
    prediction and selection (``side_s``), then its copy (``xfer_s``)."""
    if commit_s <= 0:  # (the two-stage form, float for float as before the commit was modelled)
        return n_layers * max(side_s, xfer_s) + min(side_s, xfer_s)
    return pipelined_s(n_layers, commit_s, side_s, xfer_s)


def repair_tail_s(n_layers: int, select_s: float, repair_xfer_s: float, commit_s: float = 0.0) -> float:
    """After the acceptance: every layer's masked commit (``commit_s``), then its repair prediction and selection
    (``select_s``), then its repair copy (none: the commits, predictions and selections alone)."""
    if commit_s <= 0 and repair_xfer_s <= 0:
        return n_layers * select_s
    if commit_s <= 0:
        return after_tail_s(n_layers, select_s, repair_xfer_s)
    return pipelined_s(n_layers, commit_s, select_s, repair_xfer_s)


def commit_tail_s(n_layers: int, commit_s: float) -> float:
    """A beside step that launches no repair: the masked commits alone, layer after layer on the compute stream."""
    return n_layers * commit_s
