"""Separating a model's reasoning (``<think>…</think>``) from its answer, while streaming.

The opening tag may come from the model or from the prompt (templates that end with
``<think>\\n`` open the block for the model). Partial tags at the end of a piece are held back,
so a tag cut across pieces is still recognized and never reaches the answer.
"""

from __future__ import annotations

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def prompt_opens_reasoning(
    prompt: str, open_tag: str = OPEN_TAG, close_tag: str = CLOSE_TAG
) -> bool:
    """True when the rendered prompt leaves a think block open for the model to continue."""
    i = prompt.rfind(open_tag)
    return i != -1 and prompt.find(close_tag, i) == -1 and not prompt[i + len(open_tag) :].strip()


def _partial_suffix(buf: str, tag: str) -> int:
    for k in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:k]):
            return k
    return 0


class ReasoningSplitter:
    """Feed streamed text; get (reasoning, answer) pieces back."""

    def __init__(
        self, *, inside: bool = False, open_tag: str = OPEN_TAG, close_tag: str = CLOSE_TAG
    ) -> None:
        self.inside = inside
        self.open_tag = open_tag
        self.close_tag = close_tag
        self._held = ""
        self._answer_started = False
        self._strip_next = False
        self.saw_reasoning = inside

    def feed(self, text: str) -> tuple[str, str]:
        buf = self._held + text
        self._held = ""
        reasoning: list[str] = []
        answer: list[str] = []
        while buf:
            if self.inside:
                i = buf.find(self.close_tag)
                if i == -1:
                    k = _partial_suffix(buf, self.close_tag)
                    reasoning.append(buf[: len(buf) - k])
                    self._held = buf[len(buf) - k :]
                    break
                reasoning.append(buf[:i])
                buf = buf[i + len(self.close_tag) :]
                self.inside = False
                self._strip_next = True
                continue
            if self._strip_next:
                stripped = buf.lstrip()
                if not stripped:  # only whitespace so far: wait for the answer itself
                    break
                buf = stripped
                self._strip_next = False
            if not self._answer_started:
                # a think block is honoured only before any answer text
                lead = len(buf) - len(buf.lstrip())
                rest = buf[lead:]
                if rest.startswith(self.open_tag):
                    buf = rest[len(self.open_tag) :]
                    self.inside = True
                    self.saw_reasoning = True
                    continue
                if rest and self.open_tag.startswith(rest):
                    self._held = buf
                    break
                if rest:
                    self._answer_started = True
            answer.append(buf)
            break
        return "".join(reasoning), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """What was held back, once the stream ends."""
        held, self._held = self._held, ""
        if self.inside:
            return held, ""
        return "", held.lstrip() if self._strip_next else held
