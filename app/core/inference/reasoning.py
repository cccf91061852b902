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


# -- gpt-oss "harmony": messages on channels ------------------------------------------------------
#
# After the prompt's ``<|start|>assistant`` the model writes one or more messages:
#   <|channel|>analysis<|message|>REASONING<|end|>
#   <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
# or, for a tool call, ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}``
# ended by ``<|call|>``. llama.cpp renders <|channel|>, <|message|>, <|start|> and <|constrain|>
# as text, but not <|end|> (a control token) and stops on <|return|> / <|call|> (end of
# generation), so a message also ends where the next header begins or where the stream ends.

H_START, H_CHANNEL, H_MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
H_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_H_MARKERS = (H_START, H_CHANNEL, *H_ENDS)
MAX_HEADER = 256  # a "header" longer than this is not one: it is passed through as text


def is_harmony_template(template: str | None) -> bool:
    return bool(template) and H_CHANNEL in (template or "") and H_MESSAGE in (template or "")


def reasoning_splitter(template: str | None, prompt: str) -> ReasoningSplitter | HarmonySplitter:
    """The splitter for a model's output: harmony channels, or ``<think>`` blocks."""
    if is_harmony_template(template):
        return HarmonySplitter()
    return ReasoningSplitter(inside=prompt_opens_reasoning(prompt))


class HarmonySplitter:
    """Feed streamed harmony text; get (reasoning, answer) pieces back.

    ``analysis`` messages are reasoning; ``final`` and plain ``commentary`` messages are the
    answer; a ``commentary`` message addressed ``to=functions.NAME`` is re-emitted in the answer
    as one ``<|channel|>commentary to=functions.NAME<|message|>ARGS<|call|>`` block, the form the
    harmony tool-call parser reads. Output that does not start with a header is plain answer.
    Same interface as :class:`ReasoningSplitter`.
    """

    def __init__(self) -> None:
        self._buf = ""
        # start (also between messages) | header | analysis | answer | tool | plain
        self._mode = "start"
        self.saw_reasoning = False

    @property
    def inside(self) -> bool:
        return self._mode == "analysis"

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning: list[str] = []
        answer: list[str] = []
        while self._buf:
            if self._mode == "plain":
                answer.append(self._buf)
                self._buf = ""
            elif self._mode == "start":
                lead = self._buf.lstrip()
                if lead.startswith((H_START, H_CHANNEL)):
                    self._buf, self._mode = lead, "header"
                elif lead and not (H_START.startswith(lead) or H_CHANNEL.startswith(lead)):
                    self._mode = "plain"
                else:
                    break  # whitespace, or the start of a marker: wait
            elif self._mode == "header":
                i = self._buf.find(H_MESSAGE)
                if i == -1:
                    if len(self._buf) > MAX_HEADER:
                        self._mode = "plain"
                        continue
                    break
                self._open(self._buf[:i], answer)
                self._buf = self._buf[i + len(H_MESSAGE) :]
            else:  # inside a message
                i, marker = _first_marker(self._buf)
                if i == -1:
                    keep = max(_partial_suffix(self._buf, m) for m in _H_MARKERS)
                    cut = len(self._buf) - keep
                    self._body(self._buf[:cut], reasoning, answer)
                    self._buf = self._buf[cut:]
                    break
                self._body(self._buf[:i], reasoning, answer)
                self._close(answer)
                if marker in H_ENDS:  # dropped; what follows is the next message's header
                    self._buf, self._mode = self._buf[i + len(marker) :], "start"
                else:  # a new header begins: it keeps its marker
                    self._buf, self._mode = self._buf[i:], "header"
        return "".join(reasoning), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """What was held back, once the stream ends (an open message ends with it)."""
        buf, self._buf = self._buf, ""
        reasoning: list[str] = []
        answer: list[str] = []
        if self._mode in ("analysis", "answer", "tool"):
            self._body(buf, reasoning, answer)
            self._close(answer)
        elif self._mode == "plain" or buf.strip():
            answer.append(buf)  # never became a message: it is text
        self._mode = "start"
        return "".join(reasoning), "".join(answer)

    def _open(self, header: str, answer: list[str]) -> None:
        channel = ""
        j = header.find(H_CHANNEL)
        if j != -1:
            rest = header[j + len(H_CHANNEL) :].strip()
            channel = rest.split()[0].split("<|")[0] if rest else ""
        k = header.find("to=")
        recipient = header[k + 3 :].split()[0].split("<|")[0] if k != -1 else ""
        if channel == "analysis":
            self._mode = "analysis"
            self.saw_reasoning = True
        elif recipient.startswith("functions."):
            self._mode = "tool"
            constrain = " <|constrain|>json" if "<|constrain|>" in header else ""
            answer.append(f"{H_CHANNEL}commentary to={recipient}{constrain}{H_MESSAGE}")
        else:
            self._mode = "answer"

    def _body(self, text: str, reasoning: list[str], answer: list[str]) -> None:
        if text:
            (reasoning if self._mode == "analysis" else answer).append(text)

    def _close(self, answer: list[str]) -> None:
        if self._mode == "tool":
            answer.append("<|call|>")


def _first_marker(buf: str) -> tuple[int, str]:
    best, which = -1, ""
    for m in _H_MARKERS:
        i = buf.find(m)
        if i != -1 and (best == -1 or i < best):
            best, which = i, m
    return best, which
