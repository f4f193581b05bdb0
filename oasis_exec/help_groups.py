"""Headings of ``python -m oasis_exec bench|generate --help``: what most runs set first, then the tuning by subject
(issue 35). Measured figures stay out of the help texts: docs/exec_tuning.md holds them."""

ENGINE_GROUPS = (
    (
        "what most runs set",
        ("model", "model_path", "device", "dtype", "mode", "max_context", "kv_budget_gb", "seed"),
    ),
    (
        "sparsity and fetching",
        (
            "block_size",
            "top_k",
            "hot_slots",
            "block_score",
            "token_rank",
            "token_basis",
            "fetch_ratio",
            "fetch_policy",
            "short_context",
            "link_gb_s",
        ),
    ),
    (
        "selection and draft",
        (
            "selection",
            "replay_path",
            "replay_ids",
            "record_path",
            "draft_path",
            "draft_vocab",
            "draft_head",
            "draft_ngram",
            "draft_gate",
        ),
    ),
    ("synthetic selection", ("synthetic", "synthetic_ahead", "synthetic_topk", "synthetic_accept")),
    ("host memory", ("host_kv_gb", "host_requests", "max_lanes", "host_kv_dtype")),
    (
        "transfers (tuning)",
        (
            "transfer",
            "host_threads",
            "host_kernel",
            "uva_programs",
            "uva_items_per_iter",
            "uva_kernel",
            "stream_priority",
            "no_transfer",
        ),
    ),
    (
        "kernels and graphs (tuning)",
        (
            "topk_kernel",
            "fused_ops",
            "fused_select",
            "plan_marks",
            "fused_hot_gather",
            "fused_kv_write",
            "ring_kernel",
            "cuda_graph",
            "decode_chain",
            "copy_graph",
            "profile",
        ),
    ),
    ("prefill", ("prefill_chunk", "prefill_interleave")),
    (
        "speculative decoding and tensor parallelism",
        ("speculative_k", "speculative_gamma", "spec_predict", "spec_chain", "tensor_parallel"),
    ),
)
