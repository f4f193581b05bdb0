"""Quick simulator command lines and hand-written traces for the simulator CLI tests."""

import json

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


def _trace(tmp_path, requests, name="t.json", **top):
    obj = {"schema": "oasiskv-trace", "version": 1, "requests": requests, **top}
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def _req(i=0, t=0.0, prompt=600, out=4):
    return {"id": i, "arrival_s": t, "prompt_tokens": prompt, "output_tokens": out}
