"""The attention modes, in one place: what each keeps on the GPU, whether it transfers, where its selection comes from.

Both backends and every tool ask a ``Mode`` for its properties instead of comparing mode names; ``get(name)`` is the
only lookup and fails with the list of names. A new mode is one entry here.

==========  ======================  ===========  ===================  ==========================================
mode        on the GPU              host copy    selection query      transfer
==========  ======================  ===========  ===================  ==========================================
dense       the whole KV            no           none (attends all)   none
quest       the whole KV            no           current              none (top-K attended in place)
retrieval   top-K working set       yes          current              on the critical path, uncapped
proxy       top-K working set       yes          previous step's      in the background, capped
lookahead   top-K working set       yes          draft token's        in the background, capped
hisparse    LRU hot cache > top-K   yes          current              misses on the critical path, uncapped
==========  ======================  ===========  ===================  ==========================================

``hisparse`` is a HiSparse-style baseline (arXiv 2608.07009; SGLang's ``--enable-hisparse``): retrieval's current
top-K, fetched on the critical path with no cap, but into a per-(request, layer, KV head) hot cache of
``ExecConfig.hot_slots`` blocks (default 2 x top_k) evicted least-recently-used, so a block selected again after it
left the top-K is a hit while it is still cached; attention reads only the step's top-K (and the local block), not
the whole hot cache (``hot_cache``). ``dense`` and ``lookahead`` also decode speculatively in the executor
(``speculative``, ``ExecConfig.speculative_k``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .echo import show

QUERY_NONE, QUERY_CURRENT, QUERY_PREVIOUS, QUERY_DRAFT = "none", "current", "previous", "draft"


@dataclass(frozen=True)
class Mode:
    name: str
    whole_kv_on_gpu: bool  # the full KV cache sits in HBM (dense, quest); else only a top-K working set does
    selects: bool  # attention reads a selected top-K of blocks (everything but dense)
    query: str  # what predicts the set: none | current (this step's query) | previous (last step's) | draft
    background: bool  # the set is fetched ahead by the prefetch pipeline, under the fetch cap
    summaries: bool  # keeps per-block min/max key summaries
    # the GPU working set is a hot cache of ExecConfig.hot_slots (>= top_k) blocks per row, evicted least recently
    # used, of which attention reads only the step's selected top-K (hisparse); else it is the top-K itself
    hot_cache: bool = False
    # the executor decodes it speculatively with ExecConfig.speculative_k > 0 (oasis_exec.runner.speculative): its verify
    # pass is written for the paged whole cache (dense) and for the background working set (lookahead)
    speculative: bool = False
    # the executor's working-set family (oasis_exec.workingset.families.FAMILIES); "" = the one its flags imply
    working_set: str = ""

    def __post_init__(self):
        if self.hot_cache and (self.whole_kv_on_gpu or self.background):
            raise ValueError(f"Mode {show(self.name)}: a hot cache is fetched on demand (sparse, not background)")

    @property
    def set_family(self) -> str:
        """The executor's working-set family: ``paged`` (the whole KV on the GPU), ``hot_cache`` (hisparse),
        ``resident`` (the other sparse modes), unless ``working_set`` names another."""
        if self.working_set:
            return self.working_set
        return "paged" if self.whole_kv_on_gpu else "hot_cache" if self.hot_cache else "resident"

    @property
    def sparse(self) -> bool:
        """Full KV in host memory, a selected working set on the GPU (the modes that transfer)."""
        return not self.whole_kv_on_gpu

    @property
    def transfers(self) -> bool:
        return self.sparse

    @property
    def takes_hot_slots(self) -> bool:
        """Whether ``hot_slots`` (more GPU blocks a row than the top-K) means anything: a hot cache's size, or a
        background mode's victim cache. Both backends' configs refuse it elsewhere."""
        return self.hot_cache or self.background

    def hot_slots_error(self, top_k: int, hot_slots: int) -> str | None:
        """Why ``hot_slots`` is refused for this mode and ``top_k`` (None: it is valid). Both backends' configs."""
        if not self.takes_hot_slots:
            return (
                f"only hisparse (its hot cache) and the background modes (a victim cache) take it, not mode={self.name}"
            )
        if type(hot_slots) is int and hot_slots < top_k:  # anything else: the config's own type check
            return f"must be >= top_k ({top_k}): the GPU holds the step's top-K"
        return None

    def resident_slots(self, top_k: int, hot_slots=None) -> int:
        """Selectable GPU blocks per (request, layer, KV head): ``top_k``; in a mode with a hot cache its
        ``hot_slots`` (default ``2 * top_k``); in a background mode ``hot_slots`` when given (a victim cache, of
        which attention reads the ``top_k`` most recently selected: ``oasis_core.selection.attend_slots``). Both
        backends' configs ask this (``resident_slots``)."""
        if self.hot_cache:
            return hot_slots if hot_slots is not None else 2 * top_k
        return hot_slots if self.takes_hot_slots and hot_slots is not None else top_k

    @property
    def on_demand(self) -> bool:
        """Fetches its set on the step's critical path (no prediction ahead, no cap)."""
        return self.sparse and not self.background

    @property
    def drafts(self) -> bool:
        """Runs a draft token through the model each step for its query (the extra GEMM row)."""
        return self.query == QUERY_DRAFT

    @property
    def selects_in_place(self) -> bool:
        """Attends a selected top-K inside the whole cache on the GPU (quest): it scores, moves nothing."""
        return self.whole_kv_on_gpu and self.selects

    @property
    def attends_next_block(self) -> bool:
        """Background modes plan a step ahead, so their local (newest) block is the one the next token lands in."""
        return self.background

    @property
    def family(self) -> str:
        """The timing family a fitted predictor uses: 'dense' (whole KV in HBM) or 'sparse'."""
        return "dense" if self.whole_kv_on_gpu else "sparse"


REGISTRY: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode(
            "dense",
            whole_kv_on_gpu=True,
            selects=False,
            query=QUERY_NONE,
            background=False,
            summaries=False,
            speculative=True,
        ),
        Mode("quest", whole_kv_on_gpu=True, selects=True, query=QUERY_CURRENT, background=False, summaries=True),
        Mode("retrieval", whole_kv_on_gpu=False, selects=True, query=QUERY_CURRENT, background=False, summaries=True),
        Mode("proxy", whole_kv_on_gpu=False, selects=True, query=QUERY_PREVIOUS, background=True, summaries=True),
        Mode(
            "lookahead",
            whole_kv_on_gpu=False,
            selects=True,
            query=QUERY_DRAFT,
            background=True,
            summaries=True,
            speculative=True,
        ),
        Mode(
            "hisparse",
            whole_kv_on_gpu=False,
            selects=True,
            query=QUERY_CURRENT,
            background=False,
            summaries=True,
            hot_cache=True,
        ),
    )
}

MODES = tuple(REGISTRY)
SPARSE_MODES = tuple(n for n, m in REGISTRY.items() if m.sparse)
BACKGROUND_MODES = tuple(n for n, m in REGISTRY.items() if m.background)
SPECULATIVE_MODES = tuple(n for n, m in REGISTRY.items() if m.speculative)


def get(mode: str | Mode) -> Mode:
    """The ``Mode`` of a name (a ``Mode`` passes through); ValueError naming the known modes otherwise."""
    if isinstance(mode, Mode):
        return mode
    try:
        return REGISTRY[mode]
    except (KeyError, TypeError):
        raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {show(mode)}") from None
