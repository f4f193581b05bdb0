"""``metrics.request_rows`` rounds a column at a time (``round_list``): the same floats as ``round`` one by one."""

from __future__ import annotations

import numpy as np

from oasis_sim.metrics import REQUEST_COLUMNS, request_rows, round_list
from oasis_sim.scheduler import Req


def test_round_list_is_round():
    rng = np.random.default_rng(7)
    for nd in (0, 2, 4, 6):
        k = rng.integers(-(10**9), 10**9, 20_000)
        ties = (k + 0.5) / 10**nd  # (near) half-way cases: round's correct rounding decides them
        x = np.concatenate(
            [
                ties,
                np.nextafter(ties, np.inf),
                np.nextafter(ties, -np.inf),
                rng.random(20_000) * 10.0 ** rng.integers(-8, 12, 20_000),
                [0.0, -0.0, -1e-9, 2.675, 1e300, 2.0**53, 4503599627370495.5, np.inf, -np.inf, np.nan],
            ]
        )
        got, want = round_list(x, nd), [round(float(v), nd) for v in x]
        assert [repr(v) for v in got] == [repr(v) for v in want]


def _row(r, bpbh):  # the definition: _r / round of each figure, one request at a time
    tpot = ((r.finish_t - r.first_token_t) / (r.output - 1) * 1e3) if r.output > 1 else None
    return {
        "id": r.id,
        "arrival_s": round(float(r.arrival), 6),
        "prompt_tokens": r.prompt,
        "output_tokens": r.output,
        "admit_s": None if r.admit_t is None else round(float(r.admit_t), 6),
        "first_token_s": round(float(r.first_token_t), 6),
        "finish_s": round(float(r.finish_t), 6),
        "ttft_ms": round(float((r.first_token_t - r.arrival) * 1e3), 4),
        "tpot_ms": None if tpot is None else round(float(tpot), 4),
        "preemptions": r.preempted,
        "prefix_hit_tokens": r.prefix_hit_tokens,
        "fetched_slices": round(float(r.fetch_blocks), 2),
        "h2d_bytes": round(float(r.fetch_blocks * bpbh), 0),
        "net_bytes": round(float(r.net_bytes), 0),
        "stall_ms": round(float(r.stall_s * 1e3), 4),
        "resident_recall": round(float(r.recall_sum / r.recall_n if r.recall_n else 1.0), 6),
    }


def test_request_rows_as_one_at_a_time():
    rng = np.random.default_rng(3)
    done = []
    for i in range(500):
        r = Req(int(rng.integers(0, 10**6)) * 1000 + i, float(rng.random() * 3600), 1 + i % 700, 1 + i % 5)
        r.admit_t = None if i % 17 == 0 else r.arrival + float(rng.random())
        r.first_token_t = r.arrival + float(rng.random() * 2)
        r.finish_t = r.first_token_t + float(rng.random() * 30)
        r.preempted, r.prefix_hit_tokens = i % 3, i % 11
        r.fetch_blocks = float(rng.random() * 1e6) if i % 2 else 0
        r.net_bytes, r.stall_s = float(rng.random() * 1e9), float(rng.random() * 0.1)
        r.recall_n = i % 4
        r.recall_sum = float(rng.random() * r.recall_n)
        done.append(r)
    bpbh = 2048.5
    rows = request_rows(done, bpbh)
    want = [_row(r, bpbh) for r in sorted(done, key=lambda r: r.id)]
    assert rows == want
    assert [list(row) for row in rows] == [list(REQUEST_COLUMNS)] * len(rows)
    assert [[repr(v) for v in row.values()] for row in rows] == [[repr(v) for v in row.values()] for row in want]
    assert request_rows([], bpbh) == []
