"""The experiments' scripts (files under ``experiments/``, not a package) loaded as modules for the tests."""

import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(relpath: str, name: str | None = None):
    """``experiments/<relpath>`` executed as a fresh module (``name``: default the file's stem), registered in
    ``sys.modules`` before it runs (dataclasses look their module up while the file executes)."""
    path = os.path.join(REPO, "experiments", relpath)
    name = name or os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
