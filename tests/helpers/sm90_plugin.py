"""A pytest plugin (``-p sm90_plugin``) that notes every interpreted Triton launch of the session
(``sm90_compile.record_launches``) and writes the list as JSON to ``$OASIS_SM90_OUT`` at the end."""

import json
import os

from sm90_compile import record_launches

import oasis_kernels  # noqa: F401  -- first: it sets TRITON_INTERPRET before triton decorates its own functions

_ctx = None
_seen = None


def pytest_configure(config):
    global _ctx, _seen
    _ctx = record_launches()
    _seen = _ctx.__enter__()


def pytest_unconfigure(config):
    _ctx.__exit__(None, None, None)
    with open(os.environ["OASIS_SM90_OUT"], "w") as f:
        json.dump(_seen, f)
