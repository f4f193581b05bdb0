"""The served model id is a short slug and no response shows a local path (issue 35, newcomer): a GGUF is served
as its file's stem, not its free-text ``general.name`` (``'Smollm2 135M 8k Lc100K Mix1 Ep2'``) nor its absolute
path; ``--served-model-name`` overrides."""

import json
import os

import pytest

pytest.importorskip("fastapi")
import httpx
from server_fakes import FakeEngine, serve_app

from oasis_exec.server.app import create_app
from oasis_exec.server.config import ServerConfig


@pytest.fixture(scope="module")
def gguf():
    from oasis_exec.model.gguf import smollm2_path

    try:
        return smollm2_path()
    except (ImportError, FileNotFoundError) as e:
        pytest.skip(f"the SmolLM2 GGUF is not installed: {e}")


def test_a_gguf_is_served_as_its_file_stem(gguf):
    from oasis_exec.server.adapter import real_model

    name, positions = real_model.__wrapped__(gguf)
    assert name == os.path.splitext(os.path.basename(gguf))[0] and " " not in name and "/" not in name
    assert positions > 0


def test_models_and_errors_show_no_local_path(gguf):
    from oasis_exec.server.tokenizer import load_tokenizer

    engine = FakeEngine(step_s=0)
    engine.model_info = engine.model_info.__class__(
        **{**engine.model_info.__dict__, "name": "SmolLM2-135M-Instruct.Q4_1", "model_dir": gguf, "dummy": False}
    )
    app = create_app(engine, load_tokenizer(gguf), ServerConfig())
    with serve_app(app) as url:
        models = httpx.get(f"{url}/v1/models").json()
        wrong = httpx.post(f"{url}/v1/completions", json={"model": "nope", "prompt": "a"}).json()
    text = json.dumps(models) + json.dumps(wrong)
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1"
    assert os.path.dirname(gguf) not in text and "/work" not in text and "/tmp" not in text, text
