"""The OpenAI wire contract on the real server with the real openai client and SmolLM2."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import threading
import time

import openai
import pytest

from tests.conftest import Served, assert_greedy_close

pytestmark = pytest.mark.model


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=280)


def raw_post(
    s: Served, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request(
        "POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), out


def sse_events(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


MSG = [{"role": "user", "content": "Write one sentence about the sea."}]


def test_models_list_and_get(served: Served) -> None:
    c = client(served)
    models = c.models.list().data
    ids = [m.id for m in models]
    assert served.model_id in ids
    m = c.models.retrieve(served.model_id)
    assert m.object == "model" and m.owned_by and isinstance(m.created, int)
    extra = m.model_dump()
    assert extra["state"] in ("loaded", "not-loaded", "loading")
    assert extra["format"] == "gguf"
    with pytest.raises(openai.NotFoundError) as ei:
        c.models.retrieve("no-such-model")
    assert ei.value.body["code"] == "model_not_found"


def test_chat_non_stream(served: Served) -> None:
    r = client(served).chat.completions.create(
        model=served.model_id, messages=MSG, max_tokens=24, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_sequence(served: Served) -> None:
    chunks = list(
        client(served).chat.completions.create(
            model=served.model_id, messages=MSG, max_tokens=20, temperature=0, stream=True
        )
    )
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    assert all(c.choices[0].delta.role is None for c in chunks[1:]), "role is sent once"
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.choices[0].delta.content is None
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip()
    assert all(c.usage is None for c in chunks), "no usage chunk without include_usage"


def test_stream_include_usage_and_done(served: Served) -> None:
    body = {
        "model": served.model_id,
        "messages": MSG,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, headers, raw = raw_post(served, "/v1/chat/completions", body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    assert all("usage" in o and o["usage"] is None for o in objs[:-1])
    usage = objs[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    # earlier tests' prompts share the template's system prompt: part of it may be cached,
    # never the prompt's last token (its logits are computed again)
    cached = usage["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 <= cached < usage["usage"]["prompt_tokens"]
    assert usage["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert objs[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert objs[-2]["choices"][0]["delta"] == {}

    # the openai client's stream() helper accumulates it without duplicating the role
    with client(served).chat.completions.stream(
        model=served.model_id,
        messages=MSG,
        max_tokens=400,
        temperature=0,
        stream_options={"include_usage": True},
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.role == "assistant"
    assert final.usage.completion_tokens > 0


def test_unknown_model_404(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as ei:
        client(served).chat.completions.create(model="missing-model", messages=MSG)
    body = ei.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert body["type"] == "invalid_request_error" and "missing-model" in body["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": -1}, "top_p"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_completion_tokens": "ten"}, "max_completion_tokens"),
        ({"n": 99}, "n"),
        ({"logit_bias": {"999999999": 10}}, "logit_bias"),
        ({"logit_bias": {"50": 500}}, "logit_bias"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "tools[0]"),
        (
            {"response_format": {"type": "json_object", "oops": 1}, "tool_choice": "required"},
            "tool_choice",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stop": 7}, "stop"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": []}, "messages"),
    ],
)
def test_validation_400_names_param(served: Served, extra: dict, param: str) -> None:
    body = {"model": served.model_id, "messages": MSG, **extra}
    status, headers, raw = raw_post(served, "/v1/chat/completions", body)
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    assert headers.get("x-should-retry") == "false"


@pytest.mark.parametrize(
    "raw_body",
    [
        b'{"model": "x", "messages": [',
        b"[1,2]",
        b'{"temperature": NaN, "model": "x"}',
        b"[" * 100_000 + b"]" * 100_000,
        b"",
    ],
)
def test_malformed_json_400(served: Served, raw_body: bytes) -> None:
    status, _, raw = raw_post(served, "/v1/chat/completions", raw_body)
    assert status == 400
    assert json.loads(raw)["error"]["type"] == "invalid_request_error"
    # the server and the model survive
    assert client(served).models.retrieve(served.model_id).id == served.model_id


def test_context_overflow_400(served: Served) -> None:
    long = "lorem ipsum dolor sit amet " * 2000
    with pytest.raises(openai.BadRequestError) as ei:
        client(served).chat.completions.create(
            model=served.model_id, messages=[{"role": "user", "content": long}], stream=True
        )
    assert ei.value.body["code"] == "context_length_exceeded"
    assert ei.value.body["param"] == "messages"


def test_max_completion_tokens_wins(served: Served) -> None:
    r = client(served).chat.completions.create(
        model=served.model_id, messages=MSG, max_tokens=50, max_completion_tokens=3, temperature=0
    )
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_content_parts_and_developer_role(served: Served) -> None:
    r = client(served).chat.completions.create(
        model=served.model_id,
        messages=[
            {"role": "developer", "content": "You answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Name a color."}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "blue"},
            {"role": "user", "content": "And another?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert r.choices[0].message.content is not None


def test_stop_strings_never_reach_client(served: Served) -> None:
    solo = client(served).chat.completions.create(
        model=served.model_id, messages=MSG, max_tokens=30, temperature=0
    )
    text = solo.choices[0].message.content
    words = text.split()
    assert len(words) > 3
    stop = " " + words[2]  # a stop string that occurs in the greedy answer
    chunks = list(
        client(served).chat.completions.create(
            model=served.model_id,
            messages=MSG,
            max_tokens=30,
            temperature=0,
            stream=True,
            stop=[stop],
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert stop not in streamed
    assert streamed == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_prompt_forms(served: Served) -> None:
    c = client(served)
    r = c.completions.create(
        model=served.model_id, prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert r.object == "text_completion" and r.choices[0].text
    ids = served.call(served.service.models._scheduler.get(served.model_id)).tokenize(
        "The capital of France is", add_special=True, parse_special=False
    )
    r2 = c.completions.create(model=served.model_id, prompt=ids, max_tokens=5, temperature=0)
    assert r2.choices[0].text == r.choices[0].text, "token-id prompt = same text prompt"
    r3 = c.completions.create(
        model=served.model_id, prompt=["Water is", "Fire is"], max_tokens=4, temperature=0
    )
    assert [ch.index for ch in r3.choices] == [0, 1]
    s = list(
        c.completions.create(
            model=served.model_id,
            prompt="One two three",
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert s[-1].usage is not None and s[-1].usage.completion_tokens == 4
    echoed = c.completions.create(model=served.model_id, prompt="Hello", echo=True, max_tokens=2)
    assert echoed.choices[0].text.startswith("Hello")
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(model=served.model_id, prompt=[10**9], max_tokens=2)
    assert ei.value.body["param"] == "prompt"


def test_concurrent_streams_match_solo(served: Served) -> None:
    """Four concurrent greedy streams (batched over the shared cache) each produce the solo
    answer, queued or batched, never cut: the same tokens with logprobs within the reuse
    tolerance, up to a near-tie where a run may pick the close second (tests/conftest.py)."""
    kw = dict(
        model=served.model_id, messages=MSG, max_tokens=40, temperature=0, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip

    def entries(items: list) -> list[tuple]:
        return [
            (e.token, e.logprob, tuple((t.token, t.logprob, ()) for t in e.top_logprobs))
            for e in items
        ]

    solo_choice = client(served).chat.completions.create(**kw).choices[0]
    solo = (solo_choice.message.content, entries(solo_choice.logprobs.content))

    def one(_: int) -> tuple[str, list, str]:
        chunks = list(client(served).chat.completions.create(stream=True, **kw))
        lps = [
            e
            for c in chunks
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, entries(lps), chunks[-1].choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(one, range(4)))
    for text, lps, finish in results:
        if not assert_greedy_close(solo[1], lps, "a concurrent stream"):
            assert text == solo[0]
        assert finish in ("stop", "length")


def _pending(s: Served) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("GET", "/api/v1/ps")
    data = json.loads(conn.getresponse().read())
    conn.close()
    return sum(m["pending_requests"] for m in data["models"])


def test_disconnect_frees_model_and_next_request_runs(served: Served) -> None:
    body = json.dumps(
        {
            "model": served.model_id,
            "messages": MSG,
            "max_tokens": 3000,
            "stream": True,
            "temperature": 1.0,
            "min_p": 0.0,
            "seed": 1,
        }
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    conn.request(
        "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    assert r.status == 200
    r.fp.readline()  # a first event has arrived: the generation is running
    r.fp.readline()
    assert _pending(served) == 1
    conn.sock.close()  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 10
    while _pending(served) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pending(served) == 0, "generation kept running after the client left"
    t0 = time.monotonic()
    r2 = client(served).chat.completions.create(model=served.model_id, messages=MSG, max_tokens=5)
    assert r2.choices[0].message.content is not None
    assert time.monotonic() - t0 < 30


def test_health_and_models_answer_during_generation(served: Served) -> None:
    done = threading.Event()

    def long_gen() -> None:
        try:
            client(served).completions.create(
                model=served.model_id,
                prompt="Once upon a time",
                max_tokens=400,
                temperature=1.0,
                seed=3,
            )
        finally:
            done.set()

    t = threading.Thread(target=long_gen)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while _pending(served) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for path in ("/health", "/v1/models"):
            assert _pending(served) == 1, "the generation should be running"
            t0 = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            assert time.monotonic() - t0 < 1.0, f"{path} blocked behind inference"
    finally:
        t.join(120)


def test_n_choices_stream_and_not(served: Served) -> None:
    c = client(served)
    r = c.chat.completions.create(
        model=served.model_id,
        messages=MSG,
        max_tokens=6,
        temperature=0,
        n=2,
        logprobs=True,
        top_logprobs=3,
    )
    assert [ch.index for ch in r.choices] == [0, 1]
    # greedy choices agree, up to a near-tie: the two decode side by side in a shared cache,
    # which changes the order attention adds up (tests/conftest.py assert_greedy_close)
    a, b = (
        [
            (t.token, t.logprob, [(x.token, x.logprob, x.bytes) for x in t.top_logprobs])
            for t in ch.logprobs.content
        ]  # type: ignore[union-attr]
        for ch in r.choices
    )
    if not assert_greedy_close(a, b, "n=2 greedy choices"):
        assert r.choices[0].message.content == r.choices[1].message.content
    assert r.usage.completion_tokens == 12
    seeded = c.chat.completions.create(
        model=served.model_id, messages=MSG, max_tokens=12, temperature=1.5, seed=11, n=3
    )
    assert len({ch.message.content for ch in seeded.choices}) > 1, "seeded choices still differ"
    chunks = list(
        c.chat.completions.create(
            model=served.model_id, messages=MSG, max_tokens=6, temperature=0, n=2, stream=True
        )
    )
    by_index: dict[int, list] = {0: [], 1: []}
    for ch in chunks:
        by_index[ch.choices[0].index].append(ch.choices[0])
    for i in (0, 1):
        assert by_index[i][0].delta.role == "assistant"
        assert by_index[i][-1].finish_reason == "length"
        text, ref = (
            "".join(x.delta.content or "" for x in by_index[i]),
            r.choices[i].message.content,
        )
        # a separate greedy run under the reuse cache may part from the first at a near-tie
        # (once "a vast," vs "a vast and", the 6th token): the same answer up to there
        assert text and len(os.path.commonprefix([text, ref or ""])) >= len(text) // 2, (text, ref)
    comp = c.completions.create(
        model=served.model_id,
        prompt=["Water is", "Fire is"],
        max_tokens=3,
        temperature=0,
        n=2,
        logprobs=2,
    )
    assert [ch.index for ch in comp.choices] == [0, 1, 2, 3]

    def entries(ch: object) -> list[tuple]:
        lp = ch.logprobs  # type: ignore[attr-defined]
        return [
            (t, p, tuple((k, v, ()) for k, v in top.items()))
            for t, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
        ]

    # a prompt's second greedy choice continues from the first one's cache: the same answer
    # up to a near-tie (the reuse prompt cache, tests/conftest.py)
    if not assert_greedy_close(entries(comp.choices[0]), entries(comp.choices[1]), "n=2"):
        assert comp.choices[0].text == comp.choices[1].text
    assert comp.choices[0].text != comp.choices[2].text


def test_logit_bias_steers_sampling(served: Served) -> None:
    c = client(served)
    base = c.completions.create(
        model=served.model_id, prompt="My favourite fruit is", max_tokens=4, temperature=0
    )
    lm = served.call(served.service.models._scheduler.get(served.model_id))  # type: ignore[attr-defined]
    banana = lm.tokenize(" banana", add_special=False, parse_special=False)[0]
    forced = c.completions.create(
        model=served.model_id,
        prompt="My favourite fruit is",
        max_tokens=3,
        temperature=0,
        logit_bias={str(banana): 100},
    )
    assert forced.choices[0].text == lm.detokenize([banana] * 3)
    first = lm.tokenize(base.choices[0].text, add_special=False, parse_special=False)[0]
    banned = c.completions.create(
        model=served.model_id,
        prompt="My favourite fruit is",
        max_tokens=4,
        temperature=0,
        logit_bias={str(first): -100},
    )
    assert lm.tokenize(banned.choices[0].text, add_special=False, parse_special=False)[0] != first


def test_tokenize_detokenize(served: Served) -> None:
    text = "Hello, lighthouse keeper!"
    st, _, raw = raw_post(served, "/tokenize", {"model": served.model_id, "content": text})
    assert st == 200
    tokens = json.loads(raw)["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    st, _, raw = raw_post(served, "/detokenize", {"model": served.model_id, "tokens": tokens})
    assert st == 200 and json.loads(raw)["content"] == text
    st, _, raw = raw_post(
        served, "/tokenize", {"model": served.model_id, "content": text, "with_pieces": True}
    )
    pieces = json.loads(raw)["tokens"]
    assert (
        "".join(p["piece"] for p in pieces).replace("Ġ", " ") == text
        or pieces[0]["id"] == tokens[0]
    )
    st, _, raw = raw_post(served, "/detokenize", {"model": served.model_id, "tokens": [10**9]})
    assert st == 400 and json.loads(raw)["error"]["param"] == "tokens"
    st, _, raw = raw_post(served, "/tokenize", {"model": "ghost", "content": "x"})
    assert st == 404


def test_logprobs_chat_and_completions(served: Served) -> None:
    import math

    c = client(served)
    r = c.chat.completions.create(
        model=served.model_id,
        messages=MSG,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob
        assert t.token == t.top_logprobs[0].token, "greedy picks the most likely token"
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4
        assert bytes(t.bytes).decode(errors="replace") == t.token
        assert sum(math.exp(x.logprob) for x in t.top_logprobs) <= 1.0001
    chunks = list(
        c.chat.completions.create(
            model=served.model_id,
            messages=MSG,
            max_tokens=5,
            temperature=0,
            logprobs=True,
            stream=True,
        )
    )
    streamed = [
        t
        for ch in chunks
        if ch.choices and ch.choices[0].logprobs
        for t in ch.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(t.top_logprobs == [] for t in streamed)
    plain = c.chat.completions.create(
        model=served.model_id, messages=MSG, max_tokens=2, temperature=0
    )
    assert plain.choices[0].logprobs is None
    comp = c.completions.create(
        model=served.model_id, prompt="One, two,", max_tokens=4, temperature=0, logprobs=2
    )
    lp = comp.choices[0].logprobs
    assert (
        len(lp.tokens) == 4
        and len(lp.token_logprobs) == 4
        and all(len(t) <= 2 for t in lp.top_logprobs)
    )
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == comp.choices[0].text
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(
            model=served.model_id, messages=MSG, top_logprobs=25, logprobs=True
        )
    assert ei.value.body["param"] == "top_logprobs"


def test_structured_output_json_schema_and_parse(served: Served) -> None:
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    c = client(served)
    parsed = c.chat.completions.parse(
        model=served.model_id,
        messages=[{"role": "user", "content": "Give me a person: Alice, 30 years old."}],
        response_format=Person,
        max_tokens=60,
        temperature=0,
    )
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.age, int)
    ask = [{"role": "user", "content": "What color is the sky?"}]
    free = c.chat.completions.create(
        model=served.model_id, messages=ask, max_tokens=20, temperature=0
    )
    assert not free.choices[0].message.content.lstrip().startswith("{"), (
        "the model does not answer JSON by itself"
    )
    obj = c.chat.completions.create(
        model=served.model_id,
        messages=ask,
        max_tokens=20,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert obj.choices[0].message.content.startswith("{"), "json_object is enforced while sampling"
    enum_schema = {
        "type": "object",
        "properties": {"color": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    }
    strict = c.chat.completions.create(
        model=served.model_id,
        messages=ask,
        max_tokens=40,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "c", "schema": enum_schema, "strict": True},
        },
    )
    assert json.loads(strict.choices[0].message.content)["color"] in ("red", "blue")
    assert strict.choices[0].finish_reason == "stop"
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in c.chat.completions.create(
            model=served.model_id,
            messages=ask,
            max_tokens=40,
            temperature=0,
            stream=True,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": enum_schema},
            },
        )
    )
    # enforced while streaming too; not compared byte for byte: the second request continues
    # from the first one's cached prompt, and greedy may take the close second of a near-tie
    # ('{"color":' vs '{"color" :', seen once; tests/conftest.py assert_greedy_close)
    assert set(json.loads(streamed)) == {"color"}
    assert json.loads(streamed)["color"] in ("red", "blue")


@pytest.mark.parametrize(
    ("rf", "param"),
    [
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {
                        "type": "object",
                        "properties": {"a": {"$ref": "#/definitions/missing"}},
                    },
                },
            },
            "response_format",
        ),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_schema", "json_schema": "nope"}, "response_format.json_schema"),
    ],
)
def test_schema_that_cannot_compile_is_400(served: Served, rf: dict, param: str) -> None:
    status, _, raw = raw_post(
        served,
        "/v1/chat/completions",
        {"model": served.model_id, "messages": MSG, "response_format": rf},
    )
    assert status == 400, raw
    assert json.loads(raw)["error"]["param"] == param


def test_deep_or_huge_schema_refused_and_server_survives(served: Served) -> None:
    for depth in (60_000, 40):  # llama.cpp #26600: a 60,000-deep grammar segfaulted llama-server
        deep = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
        body = (
            f'{{"model": "{served.model_id}", "messages": {json.dumps(MSG)}, "response_format": '
            f'{{"type": "json_schema", "json_schema": {{"name": "d", "schema": {deep}}}}}}}'
        )
        status, _, raw = raw_post(served, "/v1/chat/completions", body.encode())
        assert status == 400, raw
        assert json.loads(raw)["error"]["param"] in ("response_format.json_schema.schema", None)
    big = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(1000)},
    }
    status, _, raw = raw_post(
        served,
        "/v1/chat/completions",
        {
            "model": served.model_id,
            "messages": MSG,
            "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": big}},
        },
    )
    assert (
        status == 400 and json.loads(raw)["error"]["param"] == "response_format.json_schema.schema"
    )
    assert client(served).models.retrieve(served.model_id).id == served.model_id


def test_a_repeated_long_prompt_reports_cached_tokens(served: Served) -> None:
    """The prompt cache shows in usage (cached_tokens) and timings (cache_n, prompt_n)."""
    c = client(served)
    kw = dict(
        model=served.model_id,
        messages=[{"role": "user", "content": "Describe the harbour at dawn. " * 120}],
        max_tokens=4,
        temperature=0,
    )
    first = c.chat.completions.create(**kw)
    again = c.chat.completions.create(**kw)
    assert first.choices[0].message.content == again.choices[0].message.content
    n = again.usage.prompt_tokens
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert n > 700 and 512 <= cached < n, (n, cached)
    timings = again.model_dump()["timings"]
    assert timings["cache_n"] == cached and timings["prompt_n"] == n - cached
