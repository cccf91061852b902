"""POST /v1/rerank on real models: the shared MiniLM embedder (cosine; the quality check), a
cross-encoder built from it (rank pooling: it runs and scores each document; its head is
random, so its order means nothing), and SmolLM2 (a chat model: refused)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Served, serving
from tests.support.cross_encoder import write_cross_encoder

QUERY = "a cat sits on the mat"
DOCS = ["quarterly tax filings are due in April", "a kitten rests on a rug"]


@pytest.fixture(scope="module")
def rr(
    tmp_path_factory: pytest.TempPathFactory, embedding_gguf: Path, smollm2_path: Path
) -> Iterator[tuple[Served, dict[str, str]]]:
    home = tmp_path_factory.mktemp("rerank")
    ce = write_cross_encoder(embedding_gguf, home.parent / "minilm-cross-encoder.gguf")
    with serving(home, embedding_gguf, smollm2_path, ce) as s:
        # by resolved path: ../shared (the embedder's folder) may be a symlink
        ids = {Path(m.model.path).resolve(): m.model.id for m in s.service.models.all()}  # type: ignore[attr-defined]
        yield (
            s,
            {
                "embedder": ids[embedding_gguf.resolve()],
                "chat": ids[smollm2_path.resolve()],
                "cross": ids[ce.resolve()],
            },
        )


def post(s: Served, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(
        s.root + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_embedder_ranks_a_paraphrase_above_an_unrelated_text(rr: Any) -> None:
    s, ids = rr
    st, body = post(s, "/v1/rerank", {"model": ids["embedder"], "query": QUERY, "documents": DOCS})
    assert st == 200, body
    res = body["results"]
    assert [r["index"] for r in res] == [1, 0], "the paraphrase first"
    assert res[0]["relevance_score"] > res[1]["relevance_score"] + 0.3
    assert "document" not in res[0]
    # query + two documents, each with its [CLS] and [SEP], as the embed path counts them
    assert body["usage"]["prompt_tokens"] > 15
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]


def test_top_n_return_documents_and_text_objects(rr: Any) -> None:
    s, ids = rr
    docs = [{"text": DOCS[0]}, DOCS[1], {"text": "the stock market fell sharply"}]
    st, body = post(
        s,
        "/rerank",
        {
            "model": ids["embedder"],
            "query": QUERY,
            "documents": docs,
            "top_n": 1,
            "return_documents": True,
        },
    )
    assert st == 200, body
    assert body["results"] == [
        {
            "index": 1,
            "relevance_score": body["results"][0]["relevance_score"],
            "document": {"text": DOCS[1]},
        }
    ]


def test_refusals(rr: Any) -> None:
    s, ids = rr
    st, body = post(
        s, "/v1/rerank", {"model": ids["embedder"], "query": QUERY, "documents": ["x"] * 201}
    )
    assert st == 400 and body["error"]["param"] == "documents", body
    assert "200" in body["error"]["message"]
    st, body = post(s, "/v1/rerank", {"model": ids["chat"], "query": QUERY, "documents": DOCS})
    assert st == 400 and body["error"]["param"] == "model", body
    assert "cannot rerank" in body["error"]["message"]
    for bad, param in [
        ({"documents": []}, "documents"),
        ({"documents": [{"txt": "a"}]}, "documents[0]"),
        ({"documents": ["a", ""]}, "documents[1]"),
        ({"query": ""}, "query"),
        ({"top_n": 0}, "top_n"),
    ]:
        body_in = {"model": ids["embedder"], "query": QUERY, "documents": DOCS, **bad}
        st, body = post(s, "/v1/rerank", body_in)
        assert st == 400 and body["error"]["param"] == param, (bad, body)


def test_capabilities_name_rerank(rr: Any) -> None:
    s, ids = rr
    with urllib.request.urlopen(s.base_url + "/models", timeout=60) as r:
        caps = {m["id"]: m["capabilities"] for m in json.loads(r.read())["data"]}
    assert caps[ids["embedder"]] == ["embeddings", "rerank"]
    assert caps[ids["cross"]] == ["rerank"]
    assert caps[ids["chat"]] == ["completion", "chat"]
    st, shown = post(s, "/api/show", {"model": ids["cross"]})
    assert st == 200 and "rerank" in shown["capabilities"]


def test_a_cross_encoder_scores_each_document_by_rank_pooling(rr: Any) -> None:
    s, ids = rr
    docs = [*DOCS, "the stock market fell sharply"]
    st, body = post(s, "/v1/rerank", {"model": ids["cross"], "query": QUERY, "documents": docs})
    assert st == 200, body
    res = body["results"]
    assert sorted(r["index"] for r in res) == [0, 1, 2]
    scores = [r["relevance_score"] for r in res]
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) == 3, "each pair is scored on its own"
    # [CLS] query [SEP] document [SEP] per pair
    assert body["usage"]["prompt_tokens"] > 3 * 6
    # the same pair scores the same alone (one sequence per decode, nothing carried over)
    st, one = post(s, "/v1/rerank", {"model": ids["cross"], "query": QUERY, "documents": docs[2:]})
    by_index = {r["index"]: r["relevance_score"] for r in res}
    assert one["results"][0]["relevance_score"] == pytest.approx(by_index[2], abs=1e-4)
    # its pooled output is a score, not a vector: no embeddings from it
    st, body = post(s, "/v1/embeddings", {"model": ids["cross"], "input": "hello"})
    assert st == 400 and body["error"]["param"] == "model", body
