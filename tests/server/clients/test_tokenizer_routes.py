"""The tokenizer routes as vLLM has them, beside llama.cpp's, on the real server with SmolLM2:
lm-evaluation-harness's own remote tokenizer (detection, encode, decode, special tokens, chat
template) and the shapes it and vLLM's clients send, with no model named."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Served, serving

pytestmark = pytest.mark.model

CHAT = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Name a colour of the sea."},
]


@pytest.fixture(scope="module")
def two(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Served]:
    """SmolLM2 and an embedding model: one chat model in the library, two once both load."""
    with serving(tmp_path_factory.mktemp("tok"), smollm2_path, embedding_gguf) as s:
        yield s


def post(s: Served, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{s.root}{path}", json=body, timeout=120)


def test_lm_eval_detects_and_uses_the_remote_tokenizer(served: Served) -> None:
    from lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support

    assert check_remote_tokenizer_support(served.base_url + "/completions")
    tok = RemoteTokenizer(served.base_url + "/completions")
    text = "Hello, lighthouse keeper!"
    ids = tok.encode(text)
    llama = post(served, "/tokenize", {"model": served.model_id, "content": text}).json()
    assert ids == llama["tokens"]
    assert tok.decode(ids) == text
    lm = served.call(served.service.models._scheduler.get(served.model_id))  # type: ignore[attr-defined]
    sp = lm.special_tokens
    assert tok.eos_token == sp["eos"] and tok.eos_token_id == sp["eos_id"]
    if sp["bos_id"] is not None:
        assert tok.bos_token_id == sp["bos_id"]
    # the template lm-eval renders itself gives the tokens Hearth's own chat path submits
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True)
    ours = post(served, "/tokenize", {"messages": CHAT}).json()
    assert tok.encode(rendered) == ours["tokens"]
    usage = post(
        served,
        "/v1/chat/completions",
        {"model": served.model_id, "messages": CHAT, "max_tokens": 1},
    ).json()["usage"]
    assert ours["count"] == usage["prompt_tokens"] == len(ours["tokens"])


def test_vllm_prompt_form_counts_and_spells_tokens(served: Served) -> None:
    text = "The tide is high."
    plain = post(served, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert plain["count"] == len(plain["tokens"]) > 0
    assert plain["max_model_len"] > plain["count"]
    assert "token_strs" not in plain
    spelled = post(
        served,
        "/tokenize",
        {"prompt": text, "add_special_tokens": False, "return_token_strs": True},
    ).json()
    assert spelled["tokens"] == plain["tokens"]
    assert len(spelled["token_strs"]) == spelled["count"]
    back = post(served, "/detokenize", {"tokens": plain["tokens"]}).json()
    assert back == {"prompt": text, "content": text}
    both = post(served, "/tokenize", {"prompt": text, "content": text})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"


def test_messages_form_closes_the_prompt_as_asked(served: Served) -> None:
    opened = post(served, "/tokenize", {"messages": CHAT}).json()["tokens"]
    closed = post(served, "/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()[
        "tokens"
    ]
    assert len(closed) < len(opened) and opened[: len(closed)] == closed
    answer = [*CHAT, {"role": "assistant", "content": "Blue"}]
    cont = post(
        served,
        "/tokenize",
        {"messages": answer, "add_generation_prompt": False, "continue_final_message": True},
    ).json()
    assert post(served, "/detokenize", {"tokens": cont["tokens"]}).json()["prompt"].endswith("Blue")
    clash = post(
        served,
        "/tokenize",
        {"messages": answer, "add_generation_prompt": True, "continue_final_message": True},
    )
    assert clash.status_code == 400
    assert clash.json()["error"]["param"] == "continue_final_message"


def test_tokenizer_info_describes_the_tokenizer(served: Served) -> None:
    r = httpx.get(f"{served.root}/tokenizer_info", timeout=120)
    assert r.status_code == 200
    info = r.json()
    lm = served.call(served.service.models._scheduler.get(served.model_id))  # type: ignore[attr-defined]
    assert info["model"] == served.model_id
    assert info["eos_token"] == lm.special_tokens["eos"]
    assert info["eos_token_id"] == lm.special_tokens["eos_id"]
    assert info["chat_template"] == lm.chat_template and info["chat_template"]
    assert info["max_model_len"] == info["model_max_length"] == lm.context_length
    assert info["vocab_size"] == lm.special_tokens["n_vocab"]
    assert isinstance(info["add_bos_token"], bool) and info["tokenizer_class"]
    assert "vocab" not in info
    full = httpx.get(
        f"{served.root}/tokenizer_info",
        params={"model": served.model_id, "vocab": "true"},
        timeout=120,
    ).json()
    assert len(full["vocab"]) == info["vocab_size"]
    assert full["vocab"][info["eos_token_id"]] == info["eos_token"]
    posted = post(served, "/tokenizer_info", {"model": served.model_id}).json()
    assert posted == info
    bad = httpx.get(f"{served.root}/tokenizer_info", params={"vocab": "maybe"}, timeout=120)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "vocab"


def test_no_model_named_means_the_only_one_else_a_400_naming_model(two: Served) -> None:
    emb = next(m.model.id for m in two.service.models.all() if m.model.id != two.model_id)  # type: ignore[attr-defined]
    # nothing loaded: the library's only chat model
    info = httpx.get(f"{two.root}/tokenizer_info", timeout=120).json()
    assert info["model"] == two.model_id
    # the embedding model alone loaded: it is the one meant
    two.call(two.service.models.unload(two.model_id))  # type: ignore[attr-defined]
    assert post(two, "/tokenize", {"model": emb, "content": "hi"}).status_code == 200
    assert httpx.get(f"{two.root}/tokenizer_info", timeout=120).json()["model"] == emb
    # both loaded: no one model is meant
    assert post(two, "/tokenize", {"model": two.model_id, "content": "hi"}).status_code == 200
    for r in (
        post(two, "/tokenize", {"prompt": "hi"}),
        post(two, "/detokenize", {"tokens": [1]}),
        httpx.get(f"{two.root}/tokenizer_info", timeout=120),
    ):
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "model" and "default_model" in err["message"]
