"""llama-server's /infill, translated: the body into a fill-in-the-middle completion request
(its defaults, -1 and 0 for n_predict, the other files), and recorded deltas into its answer
and its SSE events."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.inference.generation import Completion
from app.core.types import Delta, Timings, Usage
from app.errors import InvalidRequest, UnsupportedParameter
from app.server.protocols.base import Context
from app.server.protocols.llama.parse import parse_infill
from app.server.protocols.llama.render import InfillStream, infill_response

BASE = {"input_prefix": "def f(", "input_suffix": "):\n"}


def test_the_body_becomes_a_fim_completion_with_llama_server_defaults() -> None:
    p = parse_infill(
        {
            **BASE,
            "prompt": "x",
            "input_extra": [{"filename": "a.py", "text": "A"}, {"text": "B", "time": 1}],
            "n_indent": 4,
            "t_max_predict_ms": 250,
            "t_max_prompt_ms": 0,
        }
    )
    req = p.request
    assert req.prompts == ("def f(",) and req.model == "" and p.stream is False
    assert req.infill is not None
    assert req.infill.suffix == "):\n" and req.infill.cursor == "x"
    # a file without a name is llama-server's "tmp"
    assert req.infill.extra == (("a.py", "A"), ("tmp", "B")) and req.infill.indent == 4
    assert req.infill.param == "input_suffix"
    assert req.max_predict_ms == 250 and req.max_prompt_ms is None  # 0: no limit
    s = req.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.8, 40, 0.95, 0.05, None)
    assert req.max_tokens is None  # no n_predict: until the context is full


@pytest.mark.parametrize(("n", "want"), [(-1, None), (0, 0), (16, 16)])
def test_n_predict(n: int, want: int | None) -> None:
    assert parse_infill({**BASE, "n_predict": n}).request.max_tokens == want


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_suffix": "x"}, "input_prefix"),
        ({"input_prefix": "x"}, "input_suffix"),
        ({**BASE, "input_extra": {"text": "x"}}, "input_extra"),
        ({**BASE, "input_extra": [{"filename": "a"}]}, "input_extra[0].text"),
        ({**BASE, "prompt": 3}, "prompt"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_infill(body)
    assert e.value.param == param


def test_samplers_left_out_do_not_run() -> None:
    # llama.vscode's list: no temperature, min-p or penalties in llama-server's chain either
    body = {**BASE, "samplers": ["top_k", "top_p", "infill"], "top_p": 0.99, "temperature": 0.1}
    s = parse_infill(body).request.sampling
    assert (s.top_k, s.top_p, s.infill) == (40, 0.99, True)
    assert (s.temperature, s.min_p, s.repeat_penalty) == (1.0, 0.0, 1.0)
    letters = parse_infill({**BASE, "samplers": "kt", "temperature": 0.1}).request.sampling
    assert (letters.top_k, letters.temperature, letters.top_p, letters.infill) == (
        40,
        0.1,
        1.0,
        False,
    )
    with pytest.raises(InvalidRequest) as e:
        parse_infill({**BASE, "samplers": ["mirostat"]})
    assert e.value.param == "samplers"


def test_what_cannot_be_honoured_is_refused() -> None:
    with pytest.raises(UnsupportedParameter) as e:
        parse_infill({**BASE, "lora": [{"id": 0, "scale": 0.5}]})
    assert e.value.param == "lora"
    # what cannot change the answer passes
    parse_infill({**BASE, "cache_prompt": True, "id_slot": 2, "n_keep": 4})


FINAL = Delta(
    finish_reason="stop",
    stop_string="\n\n",
    usage=Usage(prompt_tokens=30, completion_tokens=3, cached_tokens=4),
    timings=Timings(prompt_n=26, prompt_ms=52.0, predicted_n=3, predicted_ms=30.0, cache_n=4),
)


def test_the_whole_answer_is_llama_servers() -> None:
    req = parse_infill(BASE).request
    out = infill_response(req, Completion(text="a, b", final=FINAL), Context("m"))
    assert out["content"] == "a, b" and out["stop"] is True and out["model"] == "m"
    assert out["tokens_predicted"] == 3 and out["tokens_evaluated"] == 30
    assert out["stop_type"] == "word" and out["stopping_word"] == "\n\n"
    assert out["tokens_cached"] == 4 and out["has_new_line"] is False
    assert out["timings"]["prompt_per_token_ms"] == 2.0 and out["timings"]["predicted_n"] == 3
    assert out["generation_settings"]["n_predict"] == -1


def test_the_stream_is_pieces_then_the_final_object() -> None:
    req = parse_infill({**BASE, "stream": True}).request
    r = InfillStream(req, Context("m"), prompt_tokens=30)
    frames = [*r.open(), *r.delta(0, Delta(text="a,", token_count=2))]
    frames += r.delta(0, Delta(text="", token_count=0))
    frames += r.end_choice(0, Delta(text=" b\n", token_count=1, finish_reason="length"))
    frames += r.close([])
    data = [f.data for f in frames]
    assert [d["content"] for d in data] == ["a,", " b\n", ""]
    assert [d["stop"] for d in data] == [False, False, True]
    assert data[1]["tokens_predicted"] == 3 and data[0]["tokens_evaluated"] == 30
    assert data[-1]["stop_type"] == "limit" and data[-1]["has_new_line"] is True
    assert r.framing == "sse"
