"""Quick simulator command lines and hand-written traces for the simulator CLI tests."""

import json

from oasis_sim.cli import main

QUICK = [
    "--max-requests",
    "3",
    "--top-k",
    "16",
    "--policy-layers",
    "1",
    "--profile-steps",
    "4",
    "--timeline-steps",
    "3",
    "--quiet",
]


# four closed-loop requests at concurrency 4: what the option tests (fetch policy, speculation) compare byte for byte
QUICK4 = [*QUICK[:1], "4", *QUICK[2:], "--concurrency", "4"]
OUTPUTS = ("summary.json", "requests.csv", "steps.csv", "memory.csv", "timeline.json")


def run_outputs(tmp_path, name, *extra):
    """``oasis_sim run`` of ``QUICK4`` plus ``extra`` into ``tmp_path/name``; returns {output file: its bytes}."""
    out = tmp_path / name
    assert main(["run", "--out", str(out), *QUICK4, *extra]) == 0
    return {f: (out / f).read_bytes() for f in OUTPUTS}


def _trace(tmp_path, requests, name="t.json", **top):
    obj = {"schema": "oasiskv-trace", "version": 1, "requests": requests, **top}
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def _req(i=0, t=0.0, prompt=600, out=4):
    return {"id": i, "arrival_s": t, "prompt_tokens": prompt, "output_tokens": out}
