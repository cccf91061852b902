"""Vision end to end: `hearth pull` of a GGUF repo with a projector from the fake
Hub pairs it in the library, and a real server over the real llama.cpp runtime answers images
in all four APIs: OpenAI ``image_url``, Anthropic ``image``, Ollama ``images`` and Responses
``input_image``. In each API that has logprobs (OpenAI, Ollama, Responses) two different images
give different logprobs, the same one twice the same; in every API the image's positions count in
the prompt.

The repo holds SmolLM2-135M and the tiny real projector of tests/support/vision_gguf.py (random
weights: the answers mean nothing, the pixels decide them). One server for the module.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from app.cli import main
from tests.conftest import (
    REUSE_LOGPROB_TOLERANCE,
    Served,
    assert_greedy_close,
    stop_served,
    write_settings,
)
from tests.support.fakehub import serve
from tests.support.vision_gguf import IMAGE_SIZE, N_IMAGE_TOKENS, image_rgb, write_projector

pytestmark = pytest.mark.model

REPO = "acme/SmolLM2-vision-GGUF"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROJECTOR = "mmproj-SmolLM2-135M-F16.gguf"
DEADLINE = 120.0


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.frombytes("RGB", (IMAGE_SIZE, IMAGE_SIZE), image_rgb(seed)).save(buf, "PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    from app.cli import build_service
    from app.core.util.loop import LoopThread
    from app.paths import AppPaths
    from app.server.runner import ServerController
    from app.settings import SettingsStore

    root = tmp_path_factory.mktemp("vision-pull")
    proj = write_projector(root / "mmproj.gguf").read_bytes()
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            mp.delenv(var, raising=False)
        home = root / "hearth"
        mp.setenv("HEARTH_HOME", str(home))
        mp.setenv("HF_HOME", str(root / "hf-home"))
        gen = serve()
        hub = next(gen)
        try:
            mp.setenv("HF_ENDPOINT", hub.endpoint)
            hub.add_repo(
                REPO, {MODEL_FILE: smollm2_path.read_bytes(), PROJECTOR: proj}, tags=["gguf"]
            )
            write_settings(home, port=0)
            assert main(["pull", REPO]) == 0  # `hearth pull`, in process
            paths = AppPaths.default(home).ensure()
            store = SettingsStore(paths.settings_file)
            service = build_service(paths, store.load())
            (model,) = service.models._library.list()
            loop = LoopThread().start()
            ctl = ServerController(service, store, paths)
            url = loop.call(ctl.start("127.0.0.1", 0), 30)
            s = Served(home, url, ctl.port, model.id, service, loop, ctl)
            try:
                yield s
            finally:
                stop_served(s)
        finally:
            gen.close()


def post_raw(s: Served, path: str, body: dict[str, Any]) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", int(s.port), timeout=DEADLINE)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    raw = r.read()
    assert r.status == 200, raw
    return raw


def post(s: Served, path: str, body: dict[str, Any]) -> Any:
    return json.loads(post_raw(s, path, body))


def openai(s: Served, *images: bytes) -> Any:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in this picture?"}]
    parts += [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(im)}}
        for im in images
    ]
    body = {
        "model": s.model_id,
        "messages": [{"role": "user", "content": parts}],
        "max_tokens": 2,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    return post(s, "/v1/chat/completions", body)


def anthropic(s: Served, *images: bytes) -> Any:
    parts: list[dict[str, Any]] = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(im)}}
        for im in images
    ]
    parts.append({"type": "text", "text": "What is in this picture?"})
    body = {
        "model": s.model_id,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": parts}],
    }
    return post(s, "/v1/messages", body)


def ollama_body(s: Served, *images: bytes, stream: bool = False) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "user", "content": "What is this?"}
    if images:
        msg["images"] = [b64(im) for im in images]
    return {
        "model": s.model_id,
        "stream": stream,
        "options": {"num_predict": 2, "temperature": 0},
        "logprobs": True,
        "top_logprobs": 5,
        "messages": [msg],
    }


def ollama(s: Served, *images: bytes) -> Any:
    return post(s, "/api/chat", ollama_body(s, *images))


def responses_body(s: Served, *images: bytes, stream: bool = False) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "input_text", "text": "What is in this picture?"}]
    parts += [
        {"type": "input_image", "image_url": "data:image/png;base64," + b64(im)} for im in images
    ]
    return {
        "model": s.model_id,
        "stream": stream,
        "max_output_tokens": 2,
        "temperature": 0,
        "top_logprobs": 5,
        "include": ["message.output_text.logprobs"],
        "input": [{"role": "user", "content": parts}],
    }


def responses(s: Served, *images: bytes) -> Any:
    return post(s, "/v1/responses", responses_body(s, *images))


Logprob = tuple[str, float, list[tuple[str, float]]]


def _first(lp: dict[str, Any]) -> Logprob:
    return lp["token"], lp["logprob"], [(t["token"], t["logprob"]) for t in lp["top_logprobs"]]


def first_token(answer: Any) -> Logprob:
    return _first(answer["choices"][0]["logprobs"]["content"][0])


def ollama_first_token(answer: Any) -> Logprob:
    return _first(answer["logprobs"][0])


def responses_first_token(answer: Any) -> Logprob:
    (msg,) = [item for item in answer["output"] if item["type"] == "message"]
    return _first(msg["content"][0]["logprobs"][0])


def assert_images_decide(
    ask: Callable[[bytes], Any], first: Callable[[Any], Logprob], a: Any, red: bytes, other: bytes
) -> None:
    """``a`` is ``ask(red)``'s answer. Other pixels, other top alternatives; the same image
    again, the same first token with its logprob within the reuse tolerance."""
    tok_a, lp_a, top_a = first(a)
    assert len(top_a) == 5
    assert top_a != first(ask(other))[2]  # other pixels, other logits
    tok_a2, lp_a2, _ = first(ask(red))
    assert tok_a2 == tok_a and abs(lp_a2 - lp_a) <= REUSE_LOGPROB_TOLERANCE  # the same again


def test_the_pulled_model_has_its_projector(
    srv: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    model = srv.service.models._library.get(srv.model_id)  # type: ignore[attr-defined]
    proj = Path(model.path).parent / PROJECTOR
    assert model.extra["projector"] == str(proj) and proj.is_file()
    assert "vision" in model.capabilities
    capsys.readouterr()
    assert main(["ls", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["projector"] == {"path": str(proj), "size": proj.stat().st_size}
    assert main(["ls"]) == 0
    head, line = capsys.readouterr().out.splitlines()
    assert head.split()[-1] == "INPUT" and line.split()[-1] == "vision"


def test_import_says_why_a_projector_next_to_a_model_is_not_paired(
    srv: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tests.support.fakehub import gguf_bytes

    model = tmp_path / "tiny-Q4_K_M.gguf"  # embedding size 64: SmolLM2's projector makes 576
    model.write_bytes(gguf_bytes(tmp_path / "build"))
    write_projector(tmp_path / "mmproj-F16.gguf")
    capsys.readouterr()
    assert main(["import", str(model)]) == 0
    out = capsys.readouterr()
    assert "not paired with a projector" in out.err
    assert "embedding size 576 does not match the model's 64" in out.err
    mid = out.out.strip()
    assert srv.service.models._library.get(mid).summary()["projector"] is None  # type: ignore[attr-defined]


def test_images_answer_in_all_four_apis_and_decide_the_logits(srv: Served) -> None:
    red, other = png(1), png(2)
    a = openai(srv, red)
    assert a["usage"]["completion_tokens"] >= 1 and isinstance(
        a["choices"][0]["message"]["content"], str
    )
    # the image's positions count in the prompt (mtmd's count for a 32x32 image)
    assert a["usage"]["prompt_tokens"] == openai(srv)["usage"]["prompt_tokens"] + N_IMAGE_TOKENS
    assert_images_decide(lambda im: openai(srv, im), first_token, a, red, other)

    m = anthropic(srv, red)
    assert m["type"] == "message" and m["usage"]["output_tokens"] >= 1
    assert [c["type"] for c in m["content"]] == ["text"]
    assert m["usage"]["input_tokens"] == anthropic(srv)["usage"]["input_tokens"] + N_IMAGE_TOKENS

    o = ollama(srv, red)
    assert o["done"] is True and o["eval_count"] >= 1 and isinstance(o["message"]["content"], str)
    assert o["prompt_eval_count"] == ollama(srv)["prompt_eval_count"] + N_IMAGE_TOKENS
    assert_images_decide(lambda im: ollama(srv, im), ollama_first_token, o, red, other)

    r = responses(srv, red)
    assert r["status"] in ("completed", "incomplete") and r["usage"]["output_tokens"] >= 1
    assert any(item["type"] == "message" for item in r["output"])
    assert r["usage"]["input_tokens"] == responses(srv)["usage"]["input_tokens"] + N_IMAGE_TOKENS
    assert_images_decide(lambda im: responses(srv, im), responses_first_token, r, red, other)


def _transcript(lps: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """An answer's logprobs as assert_greedy_close reads them: (token, logprob, top)."""
    return [
        (
            lp["token"],
            lp["logprob"],
            [(t["token"], t["logprob"], t["bytes"]) for t in lp["top_logprobs"]],
        )
        for lp in lps
    ]


def test_streamed_logprobs_of_an_image_are_those_of_the_whole_answer(srv: Served) -> None:
    red = png(1)
    # Ollama: each line's logprobs, joined, are the whole answer's list; the done line has none
    raw = post_raw(srv, "/api/chat", ollama_body(srv, red, stream=True)).decode()
    lines = [json.loads(x) for x in raw.splitlines() if x]
    streamed = [lp for x in lines for lp in x.get("logprobs", [])]
    whole = ollama(srv, red)["logprobs"]
    assert lines[-1]["done"] and "logprobs" not in lines[-1]
    assert streamed and all(len(lp["top_logprobs"]) == 5 for lp in streamed)
    assert_greedy_close(_transcript(streamed), _transcript(whole), "ollama")  # up to a near-tie
    # Responses: the output_text.delta events' lists, joined, start output_text.done's (a last
    # token that wrote no text is only there), which is the whole answer's output_text part's
    raw = post_raw(srv, "/v1/responses", responses_body(srv, red, stream=True)).decode()
    events = [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: ")]
    deltas = [
        lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]
    ]
    (done,) = [e["logprobs"] for e in events if e["type"] == "response.output_text.done"]
    (msg,) = [item for item in responses(srv, red)["output"] if item["type"] == "message"]
    whole = msg["content"][0]["logprobs"]
    assert deltas and done[: len(deltas)] == deltas
    assert_greedy_close(_transcript(done), _transcript(whole), "responses")
