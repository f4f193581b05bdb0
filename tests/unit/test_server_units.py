"""Server pieces in-process: schemas and errors, stop strings, detokenization, the engine loop's guarantees."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")

from pydantic import ValidationError
from server_fakes import FakeEngine

from oasis_exec.server import schemas as S
from oasis_exec.server.engine_loop import EngineLoop, QueueFull, Rejected
from oasis_exec.server.engine_protocol import Sampling
from oasis_exec.server.errors import from_validation_error
from oasis_exec.server.generation import StopMatcher
from oasis_exec.server.tokenizer import ByteTokenizer


def _param(model, body: str) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as e:
        model.model_validate_json(body)
    err = from_validation_error(e.value)
    assert err.status == 400
    return err.param, err.message


@pytest.mark.parametrize(
    "body, param",
    [
        ('{"model": "m"}', "prompt"),
        ('{"prompt": "x"}', "model"),
        ('{"model": "m", "prompt": "x", "max_tokens": 0}', "max_tokens"),
        ('{"model": "m", "prompt": "x", "max_tokens": "5"}', "max_tokens"),
        ('{"model": "m", "prompt": "x", "max_tokens": 2.5}', "max_tokens"),
        ('{"model": "m", "prompt": "x", "temperature": "hot"}', "temperature"),
        ('{"model": "m", "prompt": "x", "temperature": -1}', "temperature"),
        ('{"model": "m", "prompt": "x", "stream": "yes"}', "stream"),
        ('{"model": "m", "prompt": "x", "stop": 3}', "stop"),
        ('{"model": "m", "prompt": "x", "n": 2}', "n"),
        ('{"model": "m", "prompt": 5}', "prompt"),
        ('{"model": "m", "prompt": [1, "a"]}', "prompt"),
        ('{"model": "m", "prompt": [1, -2]}', "prompt"),
        ('{"model": "m", "prompt": ["a", 5]}', "prompt"),
        ('{"model": "m", "prompt": ["a", []]}', "prompt"),
        ('{"model": 7, "prompt": "x"}', "model"),
    ],
)
def test_completion_request_errors_name_the_field(body, param):
    assert _param(S.CompletionRequest, body)[0] == param


@pytest.mark.parametrize(
    "body, param",
    [
        ('{"model": "m"}', "messages"),
        ('{"model": "m", "messages": []}', "messages"),
        ('{"model": "m", "messages": [{"content": "hi"}]}', "messages[0].role"),
        ('{"model": "m", "messages": [{"role": "robot", "content": "hi"}]}', "messages[0].role"),
        ('{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}',
            "max_completion_tokens",
        ),
    ],
)
def test_chat_request_errors_name_the_field(body, param):
    assert _param(S.ChatCompletionRequest, body)[0] == param


def test_malformed_json_and_non_object_body():
    assert _param(S.CompletionRequest, '{"model": ')[0] is None
    assert "not valid JSON" in _param(S.CompletionRequest, '{"model": ')[1]
    assert "JSON object" in _param(S.CompletionRequest, "[1, 2]")[1]


def test_request_normalisation():
    r = S.CompletionRequest.model_validate_json('{"model": "m", "prompt": [[1, 2, 3]], "stop": "x"}')
    assert (r.prompts(), r.stop, r.max_tokens, r.temperature) == ([[1, 2, 3]], ["x"], None, 1.0)  # a batch of one
    batch = S.CompletionRequest.model_validate_json('{"model": "m", "prompt": ["a", [7], "b"]}')
    assert batch.prompts() == ["a", [7], "b"]
    assert S.CompletionRequest.model_validate_json('{"model": "m", "prompt": [7, 8]}').prompts() == [[7, 8]]
    c = S.ChatCompletionRequest.model_validate_json(
        '{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},'
        ' {"type": "text", "text": "b"}]}], "max_completion_tokens": 7}'
    )
    assert (c.messages[0].content, c.max_tokens) == ("ab", 7)


@pytest.mark.parametrize(
    "model, extra, param",
    [
        (S.CompletionRequest, '"unknown_field": 1', "unknown_field"),
        (S.CompletionRequest, '"frequency_penalty": 0.5', "frequency_penalty"),
        (S.CompletionRequest, '"presence_penalty": -1', "presence_penalty"),
        (S.CompletionRequest, '"logit_bias": {"5": 10}', "logit_bias"),
        (S.CompletionRequest, '"best_of": 3', "best_of"),
        (S.CompletionRequest, '"suffix": "end"', "suffix"),
        (S.CompletionRequest, '"logprobs": 21', "logprobs"),
        (S.CompletionRequest, '"max_tokens": 0', "max_tokens"),  # 0 only with echo
        (S.ChatCompletionRequest, '"tools": [{"type": "function"}]', "tools"),
        (S.ChatCompletionRequest, '"tool_choice": "auto"', "tool_choice"),
        (S.ChatCompletionRequest, '"response_format": {"type": "json_object"}', "response_format"),
        (S.ChatCompletionRequest, '"top_logprobs": 2', "top_logprobs"),  # without logprobs: true
        (S.ChatCompletionRequest, '"logprobs": 3', "logprobs"),  # chat's logprobs is a boolean
        (S.ChatCompletionRequest, '"functions": []', "functions"),
    ],
)
def test_unimplemented_parameters_are_refused_by_name(model, extra, param):
    base = '"prompt": "x"' if model is S.CompletionRequest else '"messages": [{"role": "user", "content": "x"}]'
    got, message = _param(model, f'{{"model": "m", {base}, {extra}}}')
    assert got == param and message.startswith(param)


def test_no_op_values_and_explicit_nulls_are_accepted():
    nulls = ", ".join(
        f'"{k}": null'
        for k in (
            "max_tokens",
            "temperature",
            "top_p",
            "stop",
            "stream",
            "n",
            "seed",
            "stream_options",
            "user",
            "frequency_penalty",
            "logit_bias",
        )
    )
    r = S.CompletionRequest.model_validate_json(
        f'{{"model": "m", "prompt": "x", {nulls}, "logprobs": null, "echo": null, "best_of": null, "suffix": null,'
        ' "presence_penalty": 0, "user": "me"}'
    )
    assert (r.max_tokens, r.temperature, r.top_p, r.stop, r.stream, r.logprobs, r.echo) == (
        None,
        1.0,
        1.0,
        [],
        False,
        None,
        False,
    )
    c = S.ChatCompletionRequest.model_validate_json(
        f'{{"model": "m", "messages": [{{"role": "user", "content": null, "name": null}}], {nulls},'
        ' "logprobs": true, "top_logprobs": null, "tools": [], "tool_choice": "none", "response_format": null,'
        ' "max_completion_tokens": null}'
    )
    assert (c.messages[0].content, c.top_n(), c.max_tokens) == ("", 0, None)
    e = S.CompletionRequest.model_validate_json('{"model": "m", "prompt": "x", "echo": true, "max_tokens": 0}')
    assert (e.max_tokens, e.top_n()) == (0, None)
    with pytest.raises(ValidationError):  # the required fields are not nullable
        S.CompletionRequest.model_validate_json('{"model": null, "prompt": "x"}')


def test_stop_matcher_holds_back_partial_matches():
    m = StopMatcher(["END", "\n\n"])
    assert m.feed("abcE") == ("ab", False)  # the last len("END") - 1 characters wait
    assert m.feed("N") == ("c", False)
    assert m.feed("Dtail") == ("", True)
    m = StopMatcher(["xyz"])
    assert m.feed("xy") == ("", False)
    assert m.feed("q") == ("x", False)
    assert m.flush() == "yq"
    assert StopMatcher([]).feed("abc") == ("abc", False)


def test_byte_detokenizer_never_splits_a_character():
    tok = ByteTokenizer()
    text = "héllo → wörld ✓"
    ids = tok.encode(text)
    detok = tok.detokenizer()
    pieces = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text == tok.decode(ids)
    assert all("\ufffd" not in p for p in pieces)
    assert tok.decode([256 + ord("a")]) == "a"  # ids past the byte range alias byte id % 256


async def _run_requests(engine, n, max_tokens, max_waiting=64):
    loop = EngineLoop(engine, max_waiting=max_waiting)
    loop.start()
    try:
        streams = [await loop.submit([1, 2, 3], Sampling(max_tokens=max_tokens)) for _ in range(n)]
        ends = []
        for s in streams:
            while True:
                ev = await asyncio.wait_for(s.queue.get(), 10)
                if ev.terminal:
                    ends.append(ev)
                    break
        return ends, loop.snapshot()
    finally:
        await loop.stop()


def test_engine_failure_ends_every_request_explicitly():
    ends, (stats, handoff, healthy) = asyncio.run(_run_requests(FakeEngine(fail_at_step=3, step_s=0), 5, 50))
    assert [e.finish_reason for e in ends] == ["error"] * 5
    assert all("injected failure" in e.error for e in ends)
    assert (stats.running, stats.waiting, stats.gpu_slots_used, handoff, healthy) == (0, 0, 0, 0, False)


def test_engine_loop_completes_and_frees():
    ends, (stats, handoff, healthy) = asyncio.run(_run_requests(FakeEngine(max_running=2, step_s=0), 6, 4))
    assert [e.finish_reason for e in ends] == ["length"] * 6
    assert (stats.running, stats.gpu_slots_used, handoff, healthy) == (0, 0, 0, True)


def test_queue_full_and_engine_rejection():
    async def go():
        loop = EngineLoop(FakeEngine(max_model_len=8, step_s=0), max_waiting=0)
        loop.start()
        try:
            with pytest.raises(QueueFull):
                await loop.submit([1], Sampling(max_tokens=1))
            loop.max_waiting = 4
            with pytest.raises(Rejected) as e:
                await loop.submit([1] * 8, Sampling(max_tokens=4))  # the fake refuses what exceeds its context
            assert e.value.status == 400
            assert loop.in_flight == 0
        finally:
            await loop.stop()

    asyncio.run(go())


def test_engine_flags_mirror_exec_config():
    import argparse

    from oasis_exec.config import ExecConfig
    from oasis_exec.server.adapter import add_engine_args, exec_config_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert exec_config_from_args(p.parse_args(["--model", "tiny", "--dummy"])) == ExecConfig(model="tiny")
    cfg = exec_config_from_args(
        p.parse_args(
            [
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--max-lanes",
                "3",
                "--no-cuda-graph",
                "--synthetic",
                '{"drift_rate": 0.2}',
            ]
        )
    )
    assert (cfg.device, cfg.max_lanes, cfg.cuda_graph, cfg.synthetic) == ("cpu", 3, False, {"drift_rate": 0.2})
    with pytest.raises(ValueError, match="--dummy"):
        exec_config_from_args(p.parse_args(["--dummy", "--model-path", "/some/dir"]))


def _ended(metrics) -> dict:
    return {k: metrics.requests.labels(k)._value.get() for k in ("stop", "length", "abort")}


@pytest.mark.parametrize("order", ["stop_in_last_event", "stop_then_length", "no_stop"])
def test_an_end_is_counted_as_its_client_saw_it(order):
    """A stop string completed by the tokens of the event that ends a request by length: the client gets "stop", so
    the outcome metric and the served record count a stop, not a length (the engine ends it before the reader, which
    matches stop strings, has read it: a decode chain's last event). Also when the reader's stop comes first and the
    engine's end by length overtakes its abort; and a plain end by length stays one."""
    from oasis_exec.server.engine_loop import Event, RequestStream
    from oasis_exec.server.generation import Outcome, text_pieces
    from oasis_exec.server.metrics import ServerMetrics

    async def go():
        metrics = ServerMetrics(lambda: (None, 0, True))
        loop = EngineLoop(FakeEngine(), max_waiting=4, metrics=metrics)
        tok = ByteTokenizer()
        stream = RequestStream(id=7, prompt_len=3, arrival=0.0, stops=True)
        loop._streams[7] = stream
        stop = "zz" if order == "no_stop" else "cd"
        if order == "stop_then_length":  # the stop ends a non-final event; the engine's length end comes after
            loop._deliver_one(7, Event(tok.encode("abcd")))
        else:  # one final event carries the stop's last characters
            loop._deliver_one(7, Event(tok.encode("ab")))
            loop._deliver_one(7, Event(tok.encode("cdef"), finish_reason="length"))
        outcome = Outcome()
        pieces = [p async for p in text_pieces(stream, tok.detokenizer(), [stop], loop.abort, outcome)]
        if order == "stop_then_length":
            assert _ended(metrics) == {"stop": 0, "length": 0, "abort": 0}  # not ended yet: the abort is queued
            loop._deliver_one(7, Event(finish_reason="length"))
        return pieces, outcome, _ended(metrics)

    pieces, outcome, ended = asyncio.run(go())
    if order == "no_stop":
        assert outcome.finish_reason == "length" and ended == {"stop": 0, "length": 1, "abort": 0}
        assert "".join(p.text for p in pieces) == "abcdef"
    else:
        assert outcome.finish_reason == "stop" and pieces[-1].finish_reason == "stop"
        assert "".join(p.text for p in pieces) == "ab"
        assert ended == {"stop": 1, "length": 0, "abort": 0}
