"""<think> separation on raw outputs in the documented formats, streamed in every split."""

from __future__ import annotations

import pytest

from app.core.reasoning import ReasoningSplitter, prompt_opens_reasoning


def run(text: str, *, inside: bool = False, step: int = 1) -> tuple[str, str]:
    s = ReasoningSplitter(inside=inside)
    rs, ans = [], []
    for i in range(0, len(text), step):
        r, a = s.feed(text[i : i + step])
        rs.append(r)
        ans.append(a)
    r, a = s.flush()
    return "".join(rs) + r, "".join(ans) + a


CASES = [
    # Qwen3 / DeepSeek-R1: a think block first, then the answer after blank lines
    (
        "<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4.",
        False,
        ("\nLet me add 2 and 2.\n", "The answer is 4."),
    ),
    # the template opened the block: the model starts inside it
    ("The user greets me.</think>\n\nHello!", True, ("The user greets me.", "Hello!")),
    # no reasoning at all
    ("Just an answer.", False, ("", "Just an answer.")),
    # a tag after the answer started is text, not reasoning (code, quotes)
    (
        "Use <think> tags like <think>x</think>.",
        False,
        ("", "Use <think> tags like <think>x</think>."),
    ),
    # never closed (cut by max_tokens): all of it is reasoning
    ("<think>still thinking", False, ("still thinking", "")),
    # multi-byte text and an empty think block
    ("<think></think>Grüße, 世界 🌊", False, ("", "Grüße, 世界 🌊")),
    # a lone "<thi" that never becomes a tag is released at the end
    ("<thi", False, ("", "<thi")),
]


@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
@pytest.mark.parametrize("step", [1, 2, 3, 5, 8, 1000])
def test_every_split(text: str, inside: bool, expected: tuple[str, str], step: int) -> None:
    assert run(text, inside=inside, step=step) == expected


@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
def test_every_single_cut_point(text: str, inside: bool, expected: tuple[str, str]) -> None:
    for cut in range(len(text) + 1):
        s = ReasoningSplitter(inside=inside)
        r1, a1 = s.feed(text[:cut])
        r2, a2 = s.feed(text[cut:])
        r3, a3 = s.flush()
        assert (r1 + r2 + r3, a1 + a2 + a3) == expected, cut


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert prompt_opens_reasoning("...<think>")
    assert not prompt_opens_reasoning("<think>done</think>\n<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("explain the <think> tag please\n<|im_start|>assistant\n")
