"""Prefix-affine routing vs round-robin over two real engines (not collected by pytest; a
measurement). A gateway `hearth serve` fronts two `hearth serve` engines (SmolLM2) as one
replica group twice: ``bench-prefix`` (strategy ``prefix``) and ``bench-rr`` (``round-robin``).
Several multi-turn conversations share a long system prompt; each follow-up turn resends the
whole conversation. The median time to the first streamed token of the follow-up turns is
printed for each strategy: with ``prefix`` a turn lands where its conversation's earlier turns
were read, so the engine's prompt cache can reuse them; round-robin alternates replicas.

Run:  python tests/bench/prefix_routing.py [--model PATH] [--conversations 3] [--turns 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.vs_llama_server import default_model  # noqa: E402
from tests.e2e.engines import http_request, start_hearth_engine  # noqa: E402
from tests.e2e.providers.providers_front import cli, until  # noqa: E402
from tests.e2e.serveproc import start_serve  # noqa: E402

SYSTEM = (
    "You are the help desk of a small bakery. Opening hours are seven to three, Tuesday to "
    "Sunday. Bread is baked at five each morning; croissants come out at seven and at ten. "
    "Gluten-free loaves are baked on Thursdays only. Orders over twenty loaves need a day's "
    "notice. Answer briefly and politely. "
) * 3
QUESTIONS = ("When do croissants come out?", "Is there gluten-free bread today?",
             "Can I order thirty loaves for tomorrow?", "Are you open on Monday?",
             "What time is bread baked?", "Thank you!")  # fmt: skip


def ttft(root: str, model: str, messages: list[dict[str, str]], tokens: int) -> tuple[float, str]:
    """Seconds to the first content chunk, and the whole answer's text."""
    u = urlsplit(root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"model": model, "messages": messages, "max_tokens": tokens, "stream": True,
            "temperature": 0}  # fmt: skip
    t0 = time.perf_counter()
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    first, text, buf = None, [], b""
    while chunk := resp.read1(65536):
        buf += chunk
        while b"\n\n" in buf:
            line, buf = buf.split(b"\n\n", 1)
            data = line.decode().removeprefix("data:").strip()
            if not data or data == "[DONE]":
                continue
            delta = (
                json.loads(data)["choices"][0]["delta"] if json.loads(data).get("choices") else {}
            )
            if delta.get("content"):
                first = first if first is not None else time.perf_counter() - t0
                text.append(delta["content"])
    conn.close()
    return (first if first is not None else time.perf_counter() - t0), "".join(text)


def run(root: str, model: str, conversations: int, turns: int, tokens: int) -> list[float]:
    """Play the conversations turn by turn (interleaved), the follow-up turns' TTFTs."""
    chats = [[{"role": "system", "content": SYSTEM}] for _ in range(conversations)]
    out: list[float] = []
    for turn in range(turns):
        for c, chat in enumerate(chats):
            chat.append(
                {"role": "user", "content": f"(customer {c}) {QUESTIONS[turn % len(QUESTIONS)]}"}
            )
            t, text = ttft(root, model, chat, tokens)
            chat.append({"role": "assistant", "content": text or "…"})
            if turn > 0:
                out.append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    # odd: with an even count, round-robin over two replicas would keep each conversation on
    # one replica by accident (turn after turn, the same parity)
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2, help="each strategy this often, alternated")
    a = ap.parse_args()
    model = a.model or default_model()
    tmp = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    engines = [start_hearth_engine(tmp, [model], name=f"e{i}") for i in (1, 2)]
    home = tmp / "front"
    try:
        for i, e in enumerate(engines, 1):
            r = cli(home, "providers", "add", f"e{i}", e.base_url, "--kind", "hearth")
            assert r.returncode == 0, r.stderr
        remote = next(iter(engines[0].models.values()))
        members = [f"e1/{remote}", f"e2/{remote}"]
        for name, strategy in (("bench-prefix", "prefix"), ("bench-rr", "round-robin")):
            r = cli(home, "providers", "group", name, *members, "--strategy", strategy,
                    "--prefix-tokens", "1024")  # fmt: skip
            assert r.returncode == 0, r.stderr
        front = start_serve(home)
        try:
            until(
                "both engines ready",
                lambda: (
                    all(
                        p["state"] == "ready"
                        for p in http_request(front.root + "/health").body.get("providers", [])
                    )
                    and len(http_request(front.root + "/health").body.get("providers", [])) == 2
                ),
            )
            for e in engines:  # load the model on both before timing anything
                ttft(e.root, remote, [{"role": "user", "content": "hi"}], 2)
            got: dict[str, list[float]] = {"bench-prefix": [], "bench-rr": []}
            for _ in range(a.rounds):
                for name in got:
                    got[name] += run(front.root, name, a.conversations, a.turns, a.tokens)
            for name, xs in got.items():
                print(f"{name}: median TTFT of {len(xs)} follow-up turns "
                      f"{statistics.median(xs) * 1000:.0f} ms (p90 "
                      f"{sorted(xs)[int(len(xs) * 0.9) - 1] * 1000:.0f} ms)")  # fmt: skip
        finally:
            front.stop()
    finally:
        for e in engines:
            e.close()


if __name__ == "__main__":
    main()
