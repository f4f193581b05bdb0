"""The mode registry: every property the backends read, per mode, and the lookup's error."""

import pytest

from oasis_core import modes


def test_registry_properties_match_the_table():
    got = {
        n: (m.whole_kv_on_gpu, m.selects, m.query, m.background, m.on_demand, m.drafts, m.hot_cache)
        for n, m in modes.REGISTRY.items()
    }
    assert got == {
        "dense": (True, False, "none", False, False, False, False),
        "quest": (True, True, "current", False, False, False, False),
        "retrieval": (False, True, "current", False, True, False, False),
        "proxy": (False, True, "previous", True, False, False, False),
        "lookahead": (False, True, "draft", True, False, True, False),
        "hisparse": (False, True, "current", False, True, False, True),
    }
    assert modes.SPARSE_MODES == ("retrieval", "proxy", "lookahead", "hisparse")
    assert modes.BACKGROUND_MODES == ("proxy", "lookahead")
    assert [modes.get(n).family for n in modes.MODES] == ["dense", "dense", "sparse", "sparse", "sparse", "sparse"]


def test_get_passes_modes_and_names_the_choices():
    m = modes.get("proxy")
    assert modes.get(m) is m
    with pytest.raises(ValueError, match="dense, quest, retrieval, proxy, lookahead, hisparse.*'sparse'"):
        modes.get("sparse")


def test_derived_properties_the_backends_branch_on():
    in_place = [n for n, m in modes.REGISTRY.items() if m.selects_in_place]
    next_block = [n for n, m in modes.REGISTRY.items() if m.attends_next_block]
    assert in_place == ["quest"]  # scores the whole cache on the GPU, moves nothing
    assert next_block == ["proxy", "lookahead"]  # plan a step ahead
    assert all(m.summaries == m.selects for m in modes.REGISTRY.values())
