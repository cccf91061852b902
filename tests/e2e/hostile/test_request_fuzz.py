"""A request fuzz across all four protocols against a real `hearth serve`.

Schemas, grammars, templates variables, tokenize/detokenize, token-id inputs, unicode edge
cases, nesting and huge counts, hostile images to names that take none, hostile audio forms
to the speech-to-text routes, each on the routes that take them. Every answer must be a 4xx
or a normal answer (never a 5xx or a dropped connection), the server must stay alive with
bounded memory, and /health must answer within 1 s the whole time (a thread polls it).
tests/bench/request_fuzz.py runs the same generator for as long as you like.
"""

from __future__ import annotations

import collections
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.e2e.serveproc import start_serve
from tests.support.fuzz_requests import cases
from tests.support.speech import whisper_dir

pytestmark = pytest.mark.model

SEED = 9
COUNT = 600


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def test_hostile_requests_get_4xx_or_an_answer_and_the_server_stays_responsive(
    tmp_path: Path, smollm2_path: Path, embedding_gguf: Path
) -> None:
    whisper = whisper_dir()  # audio forms too, where the speech extra and its model are here
    speech_files = [whisper] if whisper is not None and find_spec("faster_whisper") else []
    s = start_serve(
        tmp_path / "h",
        smollm2_path,
        embedding_gguf,
        *speech_files,
        settings={"load": {"context_length": 512}},  # an unbounded answer ends in seconds
    )
    chat = next(v for k, v in s.models.items() if "SmolLM2" in k)
    emb = next(v for k, v in s.models.items() if "minilm" in k.lower())
    speech = s.models[speech_files[0].stem] if speech_files else None
    for m in (chat, emb):
        assert s.post("/api/v1/models/load", {"model": m})[0] == 200
    slowest: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        while not stop.is_set():
            try:
                slowest.append(s.health_seconds())
            except AssertionError:
                slowest.append(float("inf"))
            time.sleep(0.2)

    poller = threading.Thread(target=poll_health, daemon=True)
    poller.start()
    bad: list[tuple[str, int, str, str]] = []
    seen: collections.Counter[tuple[str, int]] = collections.Counter()
    try:
        for method, path, raw, headers in cases(chat, emb, seed=SEED, count=COUNT, speech=speech):
            status, body = s.request(method, path, raw=raw, headers=headers, timeout=120)
            seen[(path, status)] += 1
            if status == 0 or status >= 500:
                bad.append((path, status, raw[:300].decode(errors="replace"), str(body)[:300]))
            if not s.alive():
                bad.append((path, -1, raw[:300].decode(errors="replace"), "the server died here"))
                break
    finally:
        stop.set()
        poller.join(30)
        peak = _peak_rss_mib(s.proc.pid) if s.alive() else 0.0
        alive = s.alive()
        s.stop()
    assert alive, f"hearth serve died after {bad[-1:]}:\n{s.stderr_tail()}"
    assert not bad, bad[:5]
    assert slowest and max(slowest) < 1.0, f"/health took {max(slowest):.2f}s at worst"
    assert peak < 2048, f"server peak RSS {peak:.0f} MiB"
    # the fuzz reached the routes and got both kinds of answer
    assert sum(n for (_, st), n in seen.items() if st == 200) >= 20, seen
    assert sum(n for (_, st), n in seen.items() if 400 <= st < 500) >= 100, seen
