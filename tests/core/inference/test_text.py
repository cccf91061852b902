"""StopMatcher: stop strings in streamed text never reach the client, at any chunking."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from app.core.inference.text import StopMatcher


def expected_output(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """The reference: everything before the earliest stop string (or all of it)."""
    hits = [i for i in (text.find(s) for s in stops if s) if i != -1]
    return (text[: min(hits)], True) if hits else (text, False)


def run(chunks: Sequence[str], stops: Sequence[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    out: list[str] = []
    stopped = False
    for c in chunks:
        piece, hit = m.feed(c)
        out.append(piece)
        if hit:
            stopped = True
            # nothing more is emitted after a stop, whatever comes
            assert m.feed("more text") == ("", True)
            break
    out.append(m.flush())
    return out, stopped


def splits(text: str, cuts: Sequence[int]) -> list[str]:
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


TEXT = "Hello there! <|im_end|> and then more"
STOP = "<|im_end|>"


def test_single_feed() -> None:
    out, stopped = run([TEXT], [STOP])
    assert "".join(out) == "Hello there! " and stopped


@pytest.mark.parametrize("cut", range(len(TEXT) + 1))
def test_every_single_split_point(cut: int) -> None:
    out, stopped = run(splits(TEXT, [cut]), [STOP])
    assert "".join(out) == "Hello there! "
    assert stopped


def test_every_pair_of_split_points() -> None:
    for a in range(len(TEXT) + 1):
        for b in range(a, len(TEXT) + 1):
            out, stopped = run(splits(TEXT, [a, b]), [STOP])
            assert "".join(out) == "Hello there! ", (a, b)
            assert stopped


def test_one_character_at_a_time_is_emitted_in_order_exactly_once() -> None:
    m = StopMatcher([STOP])
    emitted = ""
    for ch in TEXT:
        piece, hit = m.feed(ch)
        # what has been emitted is always a prefix of the answer: in order, never twice
        emitted += piece
        assert "Hello there! ".startswith(emitted)
        if hit:
            break
    assert emitted == "Hello there! "
    assert m.flush() == ""


def test_prefix_is_held_back_then_released_by_flush() -> None:
    m = StopMatcher([STOP])
    assert m.feed("answer <|im") == ("answer ", False)  # "<|im" may start the stop string
    assert m.feed("_") == ("", False)
    assert m.flush() == "<|im_"
    assert m.flush() == ""  # only once


def test_held_prefix_released_when_the_stream_continues_differently() -> None:
    m = StopMatcher([STOP])
    assert m.feed("a <|i") == ("a ", False)
    assert m.feed("ncluded|> b") == ("<|included|> b", False)
    assert m.flush() == ""


def test_earliest_stop_wins() -> None:
    for stops in (["END", "STOP"], ["STOP", "END"]):
        out, _ = run(["one STOP two END three"], stops)
        assert "".join(out) == "one "
        out, _ = run(["one END two STOP"], stops)
        assert "".join(out) == "one "


def test_overlapping_stops() -> None:
    # the longer stop's prefix must not hide a shorter stop that completes first
    out, stopped = run(["x", "y", "q", "z"], ["xyz", "yq"])
    assert "".join(out) == "x" and stopped
    out, stopped = run(["aa", "ab"], ["aab"])
    assert "".join(out) == "a" and stopped
    out, stopped = run(["ab", "ab", "c"], ["abac", "bc"])
    assert "".join(out) == "aba" and stopped


def test_stop_at_the_very_start() -> None:
    out, stopped = run(["<|im_", "end|>rest"], [STOP])
    assert "".join(out) == "" and stopped


def test_no_stops_passes_everything_through() -> None:
    for stops in ([], [""], ()):
        m = StopMatcher(stops)
        assert m.feed("abc") == ("abc", False)
        assert m.feed("") == ("", False)
        assert m.feed("<|im_end|>") == ("<|im_end|>", False)
        assert m.flush() == ""


def test_stream_without_stop_is_passed_through_whole() -> None:
    out, stopped = run(["The <", "|im", "_en", "d| nope"], [STOP])
    assert "".join(out) == "The <|im_end| nope" and not stopped


def test_unicode_stops() -> None:
    out, stopped = run(["你好", "世", "界！再见"], ["世界"])
    assert "".join(out) == "你好" and stopped
    out, stopped = run(["emoji 🙂", "🙃 end"], ["🙃"])
    assert "".join(out) == "emoji 🙂" and stopped


def test_random_streams_match_the_reference() -> None:
    rng = random.Random(99)
    alphabet = "ab<|>\n"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(0, 3))
        ]
        cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, 8)))
        out, stopped = run(splits(text, cuts), stops)
        want, want_stopped = expected_output(text, stops)
        assert "".join(out) == want, (text, stops, cuts)
        assert stopped == want_stopped, (text, stops, cuts)
