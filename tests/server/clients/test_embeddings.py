"""/v1/embeddings on the real MiniLM GGUF with the real openai client (float and base64)."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import Served, serving


@pytest.fixture(scope="module")
def emb_served(
    tmp_path_factory: pytest.TempPathFactory, embedding_gguf: Path, smollm2_path: Path
) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("emb"), embedding_gguf, smollm2_path) as s:
        yield s


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_similarity_matches_the_reference(emb_served: Served) -> None:
    # openai-python asks for base64 by default and decodes it
    r = client(emb_served).embeddings.create(
        model=emb_served.model_id,
        input=["a cat sits on the mat", "a kitten rests on a rug", "quarterly tax filings"],
    )
    v = [d.embedding for d in r.data]
    assert [d.index for d in r.data] == [0, 1, 2] and len(v[0]) == 384
    assert abs(cos(v[0], v[0]) - 1) < 1e-4, "vectors are unit length"
    assert cos(v[0], v[1]) == pytest.approx(0.66, abs=0.05)
    assert cos(v[0], v[2]) == pytest.approx(0.03, abs=0.08)
    assert r.usage.prompt_tokens > 10 and r.usage.total_tokens == r.usage.prompt_tokens


def test_float_and_base64_are_the_same_vector(emb_served: Served) -> None:
    c = client(emb_served)
    f = (
        c.embeddings.create(model=emb_served.model_id, input="hello there", encoding_format="float")
        .data[0]
        .embedding
    )
    raw = c.with_raw_response.embeddings.create(
        model=emb_served.model_id, input="hello there", encoding_format="base64"
    )
    b64 = json.loads(raw.http_response.content)["data"][0]["embedding"]
    assert isinstance(b64, str)
    decoded = struct.unpack(f"<{len(f)}f", base64.b64decode(b64))
    assert max(abs(x - y) for x, y in zip(decoded, f, strict=True)) < 1e-6


def test_token_array_inputs(emb_served: Served) -> None:
    c = client(emb_served)
    lm = emb_served.call(emb_served.service.models._scheduler.get(emb_served.model_id))  # type: ignore[attr-defined]
    ids = lm.tokenize("hello there", add_special=True, parse_special=False)
    by_text = c.embeddings.create(
        model=emb_served.model_id, input="hello there", encoding_format="float"
    ).data[0]
    by_ids = c.embeddings.create(
        model=emb_served.model_id, input=ids, encoding_format="float"
    ).data[0]
    batch = c.embeddings.create(
        model=emb_served.model_id, input=[ids, ids], encoding_format="float"
    ).data
    assert cos(by_text.embedding, by_ids.embedding) > 0.9999
    assert len(batch) == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": [1, "x"]}, "input[0]"),
        ({"input": ["ok", 5]}, "input[1]"),
        ({"input": ["x"] * 3000}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 128}, "dimensions"),
        ({"input": "word " * 1000}, "input[0]"),
        ({"input": [[10**8]]}, "input[0]"),
    ],
)
def test_bad_inputs_400(emb_served: Served, body: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client(emb_served).embeddings.create(model=emb_served.model_id, **body)
    assert ei.value.body["param"] == param


def test_a_chat_model_answers_400(emb_served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client(emb_served).embeddings.create(model="smollm2-135m-instruct.q4_1", input="hello")
    assert (
        ei.value.body["param"] == "model" and "not an embedding model" in ei.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as ei:
        client(emb_served).chat.completions.create(
            model=emb_served.model_id, messages=[{"role": "user", "content": "hi"}]
        )
    assert ei.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client(emb_served).embeddings.create(model="nope", input="x")
