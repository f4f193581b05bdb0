import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oasis_core.trace import Trace, TraceError, TraceRequest, dumps_trace, load_trace, loads_trace, save_trace


def valid_doc():
    return {
        "schema": "oasiskv-trace",
        "version": 1,
        "requests": [
            {
                "id": 0,
                "arrival_s": 0.0,
                "prompt_tokens": 1000,
                "output_tokens": 10,
                "prefix_block_ids": [0, 1],
                "prefix_block_tokens": 512,
            },
            {"id": 1, "arrival_s": 1.5, "prompt_tokens": 20, "output_tokens": 3},
            {
                "id": 7,
                "arrival_s": 1.5,
                "prompt_tokens": 513,
                "output_tokens": 1,
                "prefix_block_ids": [0, 5],
                "prefix_block_tokens": 512,
            },
        ],
    }


def load_text(tmp_path, text, name="trace.json"):
    path = tmp_path / name
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    return load_trace(path), path


def error_of(tmp_path, text):
    path = tmp_path / "trace.json"
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)
    with pytest.raises(TraceError) as e:
        load_trace(path)
    message = str(e.value)
    assert "\n" not in message
    prefix = f"{path}: "
    assert message.startswith(prefix)
    return message[len(prefix) :]


def mutated(edit):
    doc = valid_doc()
    edit(doc)
    return json.dumps(doc, indent=1)


def test_valid_trace_loads(tmp_path):
    trace, _ = load_text(tmp_path, json.dumps(valid_doc()))
    assert [r.id for r in trace.requests] == [0, 1, 7]
    assert trace.requests[0] == TraceRequest(0, 0.0, 1000, 10, (0, 1), 512)
    assert trace.requests[1].prefix_block_ids is None and trace.requests[1].total_tokens == 23
    assert trace.duration_s == 1.5
    assert (trace.meta, trace.config, trace.results) == (None, None, None)


def _set(path, value):
    def edit(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _delete(path):
    def edit(doc):
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


MALFORMED = [
    # (case id, file text, message after "<path>: ")
    ("empty", "", "empty file"),
    ("whitespace", "  \n\t\n", "empty file"),
    ("truncated", json.dumps(valid_doc())[:60], "invalid JSON at line 1 column 61: Expecting ':' delimiter"),
    ("not utf8", b'{"schema": "\xff"}', "not UTF-8 text: byte 0xff at offset 12"),
    ("nan", '{"schema": "oasiskv-trace", "version": 1, "x": NaN}', "invalid JSON: NaN is not valid JSON"),
    ("duplicate key", '{"schema": "oasiskv-trace", "schema": "x"}', 'invalid JSON: an object repeats the key "schema"'),
    ("top-level array", "[1, 2]", "top level: must be an object, got array"),
    (
        "wrong schema",
        mutated(_set(["schema"], "other-trace")),
        'schema: must be "oasiskv-trace", got "other-trace" (string)',
    ),
    ("missing schema", mutated(_delete(["schema"])), "schema: missing required field"),
    (
        "wrong version",
        mutated(_set(["version"], 2)),
        "version: must be 1 (the version this loader reads), got 2 (integer)",
    ),
    (
        "version as string",
        mutated(_set(["version"], "1")),
        'version: must be 1 (the version this loader reads), got "1" (string)',
    ),
    (
        "unknown top-level field",
        mutated(_set(["colour"], "red")),
        "colour: unknown field (allowed: schema, version, requests, meta, config, results)",
    ),
    ("missing requests", mutated(_delete(["requests"])), "requests: missing required field"),
    ("requests not array", mutated(_set(["requests"], {"0": 1})), 'requests: must be an array, got {"0": 1} (object)'),
    ("no requests", mutated(_set(["requests"], [])), "requests: must hold at least 1 request, got 0"),
    ("request not object", mutated(_set(["requests", 1], 5)), "requests[1]: must be an object, got 5 (integer)"),
    (
        "missing field",
        mutated(_delete(["requests", 2, "output_tokens"])),
        "requests[2].output_tokens: missing required field",
    ),
    (
        "unknown request field",
        mutated(_set(["requests", 0, "priority"], 1)),
        "requests[0].priority: unknown field (allowed: id, arrival_s, prompt_tokens, output_tokens, prefix_block_ids, "
        "prefix_block_tokens)",
    ),
    (
        "unknown field with newline",
        mutated(_set(["requests", 0, "a\nb"], 1)),
        'requests[0]["a\\nb"]: unknown field (allowed: id, arrival_s, prompt_tokens, output_tokens, prefix_block_ids, '
        "prefix_block_tokens)",
    ),
    (
        "zero output",
        mutated(_set(["requests", 2, "output_tokens"], 0)),
        "requests[2].output_tokens: must be >= 1, got 0",
    ),
    (
        "negative prompt",
        mutated(_set(["requests", 1, "prompt_tokens"], -5)),
        "requests[1].prompt_tokens: must be >= 1, got -5",
    ),
    (
        "bool is not int",
        mutated(_set(["requests", 1, "prompt_tokens"], True)),
        "requests[1].prompt_tokens: must be an integer, got true (boolean)",
    ),
    (
        "float is not int",
        mutated(_set(["requests", 0, "output_tokens"], 10.0)),
        "requests[0].output_tokens: must be an integer, got 10.0 (number)",
    ),
    (
        "string length",
        mutated(_set(["requests", 0, "prompt_tokens"], "1000")),
        'requests[0].prompt_tokens: must be an integer, got "1000" (string)',
    ),
    (
        "null arrival",
        mutated(_set(["requests", 1, "arrival_s"], None)),
        "requests[1].arrival_s: must be a number, got null (null)",
    ),
    (
        "negative arrival",
        mutated(_set(["requests", 0, "arrival_s"], -0.5)),
        "requests[0].arrival_s: must be >= 0.0, got -0.5",
    ),
    (
        "arrival goes back",
        mutated(_set(["requests", 2, "arrival_s"], 1.0)),
        "requests[2].arrival_s: must be >= requests[1].arrival_s (1.5), got 1.0",
    ),
    (
        "duplicate id",
        mutated(_set(["requests", 2, "id"], 0)),
        "requests[2].id: must be unique but repeats requests[0].id, got 0",
    ),
    ("negative id", mutated(_set(["requests", 1, "id"], -1)), "requests[1].id: must be >= 0, got -1"),
    (
        "huge int",
        mutated(_set(["requests", 1, "id"], 2**64)),
        "requests[1].id: must be <= 9223372036854775807, got 18446744073709551616",
    ),
    (
        "absurd token count",
        mutated(_set(["requests", 1, "output_tokens"], 2**30 + 1)),
        "requests[1].output_tokens: must be <= 1073741824, got 1073741825",
    ),
    (
        "block ids without size",
        mutated(_delete(["requests", 0, "prefix_block_tokens"])),
        "requests[0].prefix_block_tokens: must be present when prefix_block_ids is, got nothing",
    ),
    (
        "block id not int",
        mutated(_set(["requests", 0, "prefix_block_ids"], [0, "a"])),
        'requests[0].prefix_block_ids[1]: must be an integer, got "a" (string)',
    ),
    (
        "too many block ids",
        mutated(_set(["requests", 0, "prefix_block_ids"], [0, 1, 2])),
        "requests[0].prefix_block_ids: must have at most ceil(prompt_tokens / prefix_block_tokens) = 2 entries, got 3",
    ),
    ("config not object", mutated(_set(["config"], [1])), "config: must be an object, got [1] (array)"),
    (
        "results link bytes",
        mutated(_set(["results"], {"link_bytes": {"pcie_h2d": -1}})),
        "results.link_bytes.pcie_h2d: must be >= 0, got -1",
    ),
    (
        "results step missing duration",
        mutated(_set(["results"], {"steps": [{"step": 0}]})),
        "results.steps[0].duration_s: missing required field",
    ),
]


@pytest.mark.parametrize("text, message", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_trace_gives_one_exact_line(tmp_path, text, message):
    assert error_of(tmp_path, text) == message


def test_the_issue_example_message(tmp_path):
    doc = valid_doc()
    doc["requests"] = [{"id": i, "arrival_s": float(i), "prompt_tokens": 10, "output_tokens": 5} for i in range(13)]
    doc["requests"][12]["output_tokens"] = 0
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as e:
        load_trace(path)
    assert str(e.value) == f"{path}: requests[12].output_tokens: must be >= 1, got 0"


def test_unreadable_path(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(TraceError) as e:
        load_trace(missing)
    assert str(e.value) == f"{missing}: cannot read: No such file or directory"
    with pytest.raises(TraceError) as e:
        load_trace(tmp_path)  # a directory
    assert str(e.value) == f"{tmp_path}: cannot read: Is a directory"


def test_round_trip_is_exact_and_deterministic(tmp_path):
    doc = valid_doc()
    doc["meta"] = {"source": "x.jsonl", "options": {"b": 1, "a": [1, 2]}}
    doc["config"] = {"model": "qwen3-8b", "top_k": 128}
    doc["results"] = {
        "steps": [{"step": 0, "duration_s": 0.017, "layer_stage_s": {"pred": [0.1, 0.2]}}],
        "link_bytes": {"pcie_h2d": 10},
        "selection_file": "sel.npz",
        "tpot_s": 0.0177,
    }
    trace, _ = load_text(tmp_path, json.dumps(doc))
    save_trace(trace, tmp_path / "a.json")
    again = load_trace(tmp_path / "a.json")
    assert again == trace
    save_trace(again, tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert json.loads((tmp_path / "a.json").read_text()) == doc
    # one request per line
    lines = (tmp_path / "a.json").read_text().splitlines()
    assert lines[:3] == ["{", '  "schema": "oasiskv-trace",', '  "version": 1,']
    assert sum(line.lstrip().startswith('{"id": ') for line in lines) == 3


def test_dataclasses_validate_too():
    with pytest.raises(ValueError) as e:
        TraceRequest(id=1, arrival_s=0.0, prompt_tokens=0, output_tokens=1)
    assert str(e.value) == "TraceRequest.prompt_tokens: must be >= 1, got 0"
    a, b = TraceRequest(3, 2.0, 5, 5), TraceRequest(4, 1.0, 5, 5)
    with pytest.raises(ValueError) as e:
        Trace(requests=(a, b))
    assert str(e.value) == "Trace.requests[1].arrival_s: must be >= requests[0].arrival_s (2.0), got 1.0"
    with pytest.raises(ValueError) as e:
        Trace(requests=(a,), config={"x": float("inf")})
    assert str(e.value) == "Trace.config.x: must be a finite number, got inf"
    r = TraceRequest(
        id=1, arrival_s=1, prompt_tokens=600, output_tokens=2, prefix_block_ids=[4, 5], prefix_block_tokens=512
    )
    assert r.arrival_s == 1.0 and isinstance(r.arrival_s, float) and r.prefix_block_ids == (4, 5)
    assert loads_trace(dumps_trace(Trace(requests=[r]))).requests == (r,)


def test_bundled_slice_loads(repo_root):
    trace = load_trace(repo_root / "traces" / "mooncake_slice.json")
    assert len(trace.requests) == 200
    assert max(r.total_tokens for r in trace.requests) <= 40_960
    assert (repo_root / "traces" / "mooncake_slice.json").stat().st_size < 200_000


@pytest.fixture
def repo_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------------------------
# Fuzz: whatever the bytes, the loader returns a Trace or raises TraceError.

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

FIELDS = [
    "schema",
    "version",
    "requests",
    "meta",
    "config",
    "results",
    "id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "prefix_block_ids",
    "prefix_block_tokens",
    "steps",
    "link_bytes",
    "step",
    "duration_s",
]


@st.composite
def mutated_docs(draw):
    """A valid trace with a few random edits: replace, delete or add a field anywhere in it."""
    doc = valid_doc()
    doc["results"] = {"steps": [{"step": 0, "duration_s": 0.1}], "link_bytes": {"pcie_h2d": 1}}
    for _ in range(draw(st.integers(1, 3))):
        containers = []

        def walk(node):
            if isinstance(node, (dict, list)):
                containers.append(node)  # noqa: B023
                for child in node.values() if isinstance(node, dict) else node:
                    walk(child)

        walk(doc)
        target = draw(st.sampled_from(containers))
        value = draw(json_values)
        if isinstance(target, dict):
            key = draw(st.sampled_from(sorted(target) + FIELDS) if target else st.sampled_from(FIELDS))
            if draw(st.booleans()) and key in target:
                del target[key]
            else:
                target[key] = value
        elif target:
            target[draw(st.integers(0, len(target) - 1))] = value
        else:
            target.append(value)
    return doc


def _loads_only_trace_errors(data, path):
    path.write_bytes(data)
    try:
        result = load_trace(path)
    except TraceError as e:
        assert "\n" not in str(e) and str(e).startswith(f"{path}: ")
    else:
        assert isinstance(result, Trace)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=mutated_docs(), cut=st.one_of(st.none(), st.integers(0, 400)))
def test_fuzz_mutated_documents(tmp_path, doc, cut):
    data = json.dumps(doc).encode()
    _loads_only_trace_errors(data if cut is None else data[:cut], tmp_path / "fuzz.json")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.binary(max_size=200) | st.text(alphabet='{}[]":,0123456789.eE-+ntrufalsNI \n', max_size=200).map(str.encode)
)
def test_fuzz_arbitrary_bytes(tmp_path, data):
    _loads_only_trace_errors(data, tmp_path / "fuzz.json")


def test_deep_nesting(tmp_path):
    assert error_of(tmp_path, "[" * 100_000 + "]" * 100_000) == "invalid JSON: nested too deeply"
    doc = valid_doc()
    doc["meta"] = json.loads('{"a": ' * 100 + "1" + "}" * 100)
    trace, _ = load_text(tmp_path, json.dumps(doc))
    assert trace.meta == doc["meta"]
