"""The two backends' configs share their common fields through ``oasis_core.config_pieces``: none is declared in
both, each shared one is a field of both with one default and help, and the backend-specific defaults resolve."""

import dataclasses

import pytest

from oasis_core import config_pieces
from oasis_exec.config import MAX_CONTEXT, ExecConfig
from oasis_sim.config import ConfigError, SimConfig

PIECES = (
    config_pieces.RunFields,
    config_pieces.KVFields,
    config_pieces.TransferFields,
    config_pieces.BenchFields,
    config_pieces.SpeculationFields,
)


def _declared(cls) -> set:
    return set(cls.__dict__.get("__annotations__", {}))


def test_no_field_is_declared_in_both_configs():
    assert _declared(ExecConfig) & _declared(SimConfig) == set()
    assert len(_declared(ExecConfig)) > 20 and len(_declared(SimConfig)) > 20  # the check reads real declarations


def test_every_shared_field_is_one_field_of_both():
    shared = {f.name for p in PIECES for f in dataclasses.fields(p)}
    assert len(shared) == 23  # spec_chain since 2026-12-07
    ex = {f.name: f for f in dataclasses.fields(ExecConfig)}
    sim = {f.name: f for f in dataclasses.fields(SimConfig)}
    assert set(ex) & set(sim) == shared
    for name in shared:
        assert ex[name] is sim[name] or (ex[name].default, ex[name].metadata) == (sim[name].default, sim[name].metadata)
        assert ex[name].metadata["help"]


def test_backend_defaults_resolve_and_a_given_value_stays():
    e, s = ExecConfig(device="cpu"), SimConfig()
    assert (e.selection, e.max_context) == ("model", MAX_CONTEXT) == ("model", 16384 + 1024)
    assert (s.selection, s.max_context) == ("synthetic", None)
    assert ExecConfig(device="cpu", selection="synthetic", max_context=4096).max_context == 4096
    assert dataclasses.replace(e, top_k=64).selection == "model"


def test_each_backend_keeps_its_own_choices_and_messages():
    with pytest.raises(ValueError, match=r"ExecConfig.selection: must be one of model, synthetic, replay, got 'x'"):
        ExecConfig(device="cpu", selection="x")
    with pytest.raises(ConfigError, match=r"^selection: must be one of synthetic, replay, got 'model'"):
        SimConfig(selection="model")
