"""Headings of ``oasis-sim run --help``: what most runs set first, then the tuning by subject (issue 35)."""

RUN_GROUPS = (
    (
        "what most runs set",
        ("model", "hardware", "mode", "arrival", "concurrency", "rate_rps", "max_requests", "time_scale", "seed"),
    ),
    (
        "sparsity and fetching",
        (
            "top_k",
            "hot_slots",
            "block_size",
            "block_score",
            "token_rank",
            "fetch_ratio",
            "fetch_policy",
            "short_context",
        ),
    ),
    (
        "capacity and batching",
        ("max_context", "max_batch", "chunk_tokens", "hbm_utilization", "hbm_bytes", "host_bytes", "draft_state_bytes"),
    ),
    ("host->GPU transfers", ("host_kv_dtype", "transfer_path", "h2d_bytes_per_s", "gather_sm_share")),
    (
        "selection model",
        (
            "selection",
            "prediction_topk",
            "replay_file",
            "policy_sampling",
            "policy_layers",
            "profile_steps",
            "profile_replicas",
        ),
    ),
    (
        "speculative decoding",
        (
            "speculative_k",
            "speculative_gamma",
            "speculative_alpha",
            "speculative_accepted_hist",
            "spec_predict",
            "spec_chain",
        ),
    ),
    (
        "prefill/decode split and tensor parallelism",
        (
            "split",
            "nic",
            "nic_bytes_per_s",
            "nic_latency_s",
            "rpf_granularity",
            "rpf_send_summaries",
            "tensor_parallel",
        ),
    ),
    ("prefix cache", ("prefix_cache", "prefix_cache_hbm_bytes", "prefix_cache_host_bytes")),
    (
        "timing model and the bench's view",
        (
            "predictor",
            "calibration",
            "engine",
            "kv_budget_gb",
            "decode_only",
            "no_transfer",
            "decode_chain",
            "fast_forward",
        ),
    ),
    ("outputs and event model", ("event_mode", "timeline_steps")),
)
