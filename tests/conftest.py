"""Shared by every test folder (unit/, integration/, gpu/): the CUDA skip of ``gpu``-marked tests, the one-thread
fixture, and ``helpers/`` on ``sys.path`` so that test files import the shared fakes and cases by name
(``from server_fakes import FakeEngine``), wherever they sit."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent / "helpers"
if str(HELPERS) not in sys.path:
    sys.path.insert(0, str(HELPERS))


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available() or os.environ.get("OASIS_GPU_TESTS_DEVICE") == "cpu":  # cpu: a dry run of files that take it
        return
    skip = pytest.mark.skip(reason="needs CUDA (run on the GPU machine with `pytest -m gpu`)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny ops: one intra-op thread avoids OpenMP spinning on the shared CI cores (10x faster here). Use with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
