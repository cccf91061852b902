"""A soak of a real `hearth serve`: mixed traffic on all four protocols while models are
unloaded, reloaded and swapped under it (SECURITY.md 24).

Clients (threads) loop over a seeded mix: OpenAI chat streams (read whole, or cancelled after
the first chunk), completions, Responses and Anthropic streams, Ollama chats, embeddings,
tokenize/detokenize, chats through a provider (a second `hearth serve` as the remote engine) and
through an alias whose fallback chain is that provider's model then a local one, and model churn
(unload, reload with other options, swap to another model and back). The server's RSS, open
file descriptors and threads are sampled as it runs.

Each client runs a fixed number of seeded actions (``actions``), so what runs does not depend on
the machine's speed; ``seconds`` runs until a time instead (the long benchmark).

A request may fail only as unloading makes it: a 503 ``model_unloaded`` or a stream ending
with an error event when its model went away. Anything else (a 5xx, a dropped connection, a
dead server) is a failure. ``tests/e2e/test_soak.py`` runs a short fixed workload;
``tests/bench/soak.py`` runs for hours and prints the samples.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.e2e.engines import Engine, start_hearth_engine
from tests.e2e.serveproc import ServeProc, start_serve

_ERROR = re.compile(r'"error":\s*[{"]')  # an error event or line (not "error": null)
# what unloading a model under a request may do to it (anything else is a failure)
UNLOAD_CODES = ("model_unloaded", "generation_error", "server_shutting_down")


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    threads: int


@dataclass
class Report:
    requests: int = 0
    by_action: dict[str, int] = field(default_factory=dict)
    unload_failures: int = 0  # requests ended by an unload racing them (allowed)
    failures: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    baseline: Sample | None = None  # every model unloaded, after one round of each action
    final: Sample | None = None  # every model unloaded again, at the end
    died: bool = False
    unfinished: bool = False  # the fixed workload did not end before the deadline

    def growth(self) -> dict[str, float]:
        """What the server holds at the end over what it held at the start (nothing loaded)."""
        if self.baseline is None or self.final is None:
            return {}
        b, f = self.baseline, self.final
        return {
            "rss_mib": f.rss_mib - b.rss_mib,
            "fds": f.fds - b.fds,
            "threads": f.threads - b.threads,
        }


def proc_sample(pid: int, t0: float) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss = int(fields["VmRSS"].split()[0]) / 1024
    threads = int(fields["Threads"].strip())
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return Sample(time.monotonic() - t0, rss, fds, threads)


class _Client:
    def __init__(self, s: ServeProc, models: dict[str, str], report: Report, lock: Any) -> None:
        u = urlsplit(s.root)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.s, self.models, self.report, self.lock = s, models, report, lock

    def _note(self, action: str, ok: bool, unload: bool = False, detail: str = "") -> None:
        with self.lock:
            self.report.requests += 1
            self.report.by_action[action] = self.report.by_action.get(action, 0) + 1
            if unload:
                self.report.unload_failures += 1
            elif not ok:
                self.report.failures.append(f"{action}: {detail[:300]}")

    def _send(self, path: str, body: Any, *, read_chunks: int | None = None) -> tuple[int, bytes]:
        """POST; with ``read_chunks`` read only that many chunks of a stream, then hang up."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = conn.getresponse()
            if read_chunks is not None and r.status == 200:
                data = b"".join(r.read1(65536) for _ in range(read_chunks))
                return r.status, data  # closing now cancels the generation on the server
            return r.status, r.read()
        except (OSError, http.client.HTTPException) as e:
            return 0, repr(e).encode()
        finally:
            conn.close()

    def _judge(self, action: str, status: int, data: bytes, stream: bool) -> None:
        text = data.decode(errors="replace")
        if status == 200:
            if stream and (_ERROR.search(text) or "event: error" in text):
                unload = any(c in text for c in UNLOAD_CODES) or "unloaded" in text
                self._note(action, False, unload=unload, detail=text[-300:])
            else:
                self._note(action, True)
        elif status == 503 and "unload" in text:  # OpenAI's code, Ollama's/Anthropic's message
            self._note(action, False, unload=True)
        else:
            self._note(action, False, detail=f"{status} {text[:300]}")

    # -- actions ------------------------------------------------------------------------------
    def chat_stream(self, rng: random.Random, chat: str) -> None:
        cancel = rng.random() < 0.4
        body = {
            "model": chat,
            "messages": [{"role": "user", "content": f"Tell me about the number {rng.random()}"}],
            "max_tokens": rng.randint(4, 40),
            "stream": True,
        }
        st, data = self._send("/v1/chat/completions", body, read_chunks=1 if cancel else None)
        if cancel:
            self._note("chat_cancel", st == 200 or (st == 503 and b"model_unloaded" in data),
                       unload=st == 503, detail=str(st))  # fmt: skip
        else:
            self._judge("chat_stream", st, data, True)

    def completion(self, rng: random.Random, chat: str) -> None:
        body = {"model": chat, "prompt": ["Once upon", "A cat"], "max_tokens": 8, "seed": 1}
        self._judge("completion", *self._send("/v1/completions", body), False)

    def responses(self, rng: random.Random, chat: str) -> None:
        body = {"model": chat, "input": "Say hi", "max_output_tokens": 8, "stream": True}
        self._judge("responses", *self._send("/v1/responses", body), True)

    def anthropic(self, rng: random.Random, chat: str) -> None:
        body = {
            "model": chat,
            "max_tokens": 8,
            "stream": rng.random() < 0.5,
            "messages": [{"role": "user", "content": "Hello"}],
        }
        st, data = self._send("/v1/messages", body)
        self._judge("anthropic", st, data, body["stream"])

    def ollama(self, rng: random.Random, chat: str) -> None:
        body = {
            "model": chat,
            "messages": [{"role": "user", "content": "Hi"}],
            "options": {"num_predict": 8},
            "stream": rng.random() < 0.5,
        }
        st, data = self._send("/api/chat", body)
        self._judge("ollama", st, data, body["stream"])

    def embed(self, rng: random.Random, _chat: str) -> None:
        n = rng.choice([1, 8, 200])
        body = {
            "model": self.models["emb"],
            "input": [f"text {i} {rng.random()}" for i in range(n)],
        }
        self._judge("embed", *self._send("/v1/embeddings", body), False)

    def tokenize(self, rng: random.Random, chat: str) -> None:
        st, data = self._send(
            "/tokenize", {"model": chat, "content": "hello " * rng.randint(1, 5000)}
        )
        self._judge("tokenize", st, data, False)
        if st == 200:
            toks = json.loads(data)["tokens"][:500]
            self._judge(
                "detokenize", *self._send("/detokenize", {"model": chat, "tokens": toks}), False
            )

    def provider(self, rng: random.Random, _chat: str) -> None:
        """A chat on the provider's model (streamed or not): relayed from the remote engine."""
        stream = rng.random() < 0.5
        body = {
            "model": self.models["remote"],
            "messages": [{"role": "user", "content": f"Count to {rng.randint(2, 9)}"}],
            "max_tokens": rng.randint(4, 16),
            "stream": stream,
        }
        self._judge("provider", *self._send("/v1/chat/completions", body), stream)

    def alias(self, rng: random.Random, _chat: str) -> None:
        """A chat on the alias: the provider first, the local model when it fails."""
        body = {
            "model": self.models["alias"],
            "max_tokens": 8,
            "stream": rng.random() < 0.5,
            "messages": [{"role": "user", "content": "Hello"}],
        }
        st, data = self._send("/v1/messages", body)
        self._judge("alias", st, data, body["stream"])

    def churn(self, rng: random.Random, _chat: str) -> None:
        mid = rng.choice([self.models["chat"], self.models["alt"], self.models["emb"]])
        what = rng.random()
        if what < 0.4:
            st, data = self._send("/api/v1/models/unload", {"model": mid})
            self._note("unload", st == 200, detail=f"{st} {data[:200]!r}")
        elif what < 0.7:  # reload with other options (unload, then load with them)
            self._send("/api/v1/models/unload", {"model": mid})
            opts = {"context_length": rng.choice([512, 1024, 2048])}
            st, data = self._send("/api/v1/models/load", {"model": mid, "options": opts})
            # 409 model_busy: another client's request loaded it with other options meanwhile
            self._note("reload", st == 200 or _busy(st, data), detail=f"{st} {data[:200]!r}")
        else:  # swap: the other chat model in, this one out
            other = self.models["alt"] if mid == self.models["chat"] else self.models["chat"]
            st, data = self._send("/api/v1/models/load", {"model": other})
            self._send("/api/v1/models/unload", {"model": mid})
            self._note("swap", st == 200 or _busy(st, data), detail=f"{st} {data[:200]!r}")


def _busy(status: int, data: bytes) -> bool:
    """A reload refused while requests run on the model (the answer it must give then)."""
    if status != 409:
        return False
    try:
        return bool(json.loads(data)["error"]["code"] == "model_busy")
    except (ValueError, KeyError, TypeError):
        return False


ACTIONS = (
    ("chat_stream", 6), ("completion", 2), ("responses", 2), ("anthropic", 2), ("ollama", 2),
    ("embed", 2), ("tokenize", 2), ("provider", 2), ("alias", 2), ("churn", 1),
)  # fmt: skip
ALIAS = "soak-chain"


def run_soak(
    home: Path,
    chat_file: Path,
    embed_file: Path,
    *,
    seconds: float | None = None,
    actions: int | None = None,
    deadline: float = 1800.0,
    clients: int = 3,
    seed: int = 24,
    sample_every: float = 2.0,
) -> Report:
    """Run the soak: ``actions`` seeded actions per client (a fixed workload, whatever the
    machine's speed; ``deadline`` seconds at most, a liveness bound), or for ``seconds``.
    Returns what happened (the servers are stopped after)."""
    if (seconds is None) == (actions is None):
        raise ValueError("give seconds or actions")
    home.mkdir(parents=True, exist_ok=True)
    alt = home / "alt-model.gguf"  # a second chat model to swap with (another file, same weights)
    if not alt.exists():
        alt.write_bytes(chat_file.read_bytes())
    remote = start_hearth_engine(home, [chat_file], name="soak-engine")
    try:
        return _soak(home, remote, chat_file, alt, embed_file, seconds, actions, deadline,
                     clients, seed, sample_every)  # fmt: skip
    finally:
        remote.close()


def _soak(
    home: Path,
    remote: Engine,
    chat_file: Path,
    alt: Path,
    embed_file: Path,
    seconds: float | None,
    actions: int | None,
    deadline: float,
    clients: int,
    seed: int,
    sample_every: float,
) -> Report:
    s = start_serve(
        home / "h", chat_file, alt, embed_file, settings={"load": {"context_length": 1024}}
    )
    try:
        _add_provider_and_alias(s, remote)
    except BaseException:
        s.stop()
        raise
    models = {
        "chat": next(v for k, v in s.models.items() if "SmolLM2" in k),
        "alt": s.models["alt-model"],
        "emb": next(v for k, v in s.models.items() if "minilm" in k.lower()),
        "remote": "engine/" + next(iter(remote.models.values())),
        "alias": ALIAS,
    }
    report = Report()
    lock = threading.Lock()
    t0 = time.monotonic()
    names = [n for n, w in ACTIONS for _ in range(w)]
    warm = _Client(s, models, Report(), lock)
    rng = random.Random(seed)
    for name in names:  # every path once, every model loaded: then a baseline with none loaded
        getattr(warm, name)(rng, models["chat"])
    report.baseline = _idle_sample(s, models, t0)
    end = time.monotonic() + (seconds if seconds is not None else deadline)
    done = [0] * clients

    def client(i: int) -> None:
        rng = random.Random(seed * 100 + i)
        c = _Client(s, models, report, lock)
        while time.monotonic() < end and s.alive() and (actions is None or done[i] < actions):
            chat = rng.choice([models["chat"], models["chat"], models["alt"]])
            getattr(c, rng.choice(names))(rng, chat)
            done[i] += 1

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        while time.monotonic() < end and s.alive() and any(t.is_alive() for t in threads):
            report.samples.append(proc_sample(s.proc.pid, t0))
            for t in threads:  # a sample every sample_every seconds, or as soon as all are done
                t.join(sample_every / clients)
        for t in threads:
            t.join(300)
        report.died = not s.alive()
        report.unfinished = actions is not None and sum(done) < actions * clients
        if not report.died:
            report.final = _idle_sample(s, models, t0)
    finally:
        rc = s.stop()
    if report.died:
        report.failures.append(f"hearth serve died (rc {rc}):\n{s.stderr_tail()}")
    return report


def _add_provider_and_alias(s: ServeProc, remote: Engine) -> None:
    """The remote engine as provider ``engine`` (prefix ``engine/``), and an alias that tries
    its model first and the local chat model after it."""
    local = next(v for k, v in s.models.items() if "SmolLM2" in k)
    for args in (
        ("providers", "add", "engine", remote.base_url, "--kind", "hearth"),
        ("alias", "set", ALIAS, "engine/" + next(iter(remote.models.values())), local),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "app", *args],
            env={**os.environ, "HEARTH_HOME": str(s.home)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"hearth {' '.join(args)} failed: {r.stderr}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the running server picks the provider up and probes it
        st, body = s.get("/health")
        if st == 200 and {"name": "engine", "state": "ready"} in body.get("providers", []):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the provider never became ready: {s.get('/health')}")


def _idle_sample(s: ServeProc, models: dict[str, str], t0: float) -> Sample:
    """Unload every model, let the server settle, and sample it."""
    for mid in models.values():
        s.post("/api/v1/models/unload", {"model": mid})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st, body = s.get("/health")
        if st == 200 and not body.get("loaded") and not body.get("loading"):
            break
        time.sleep(0.1)
    time.sleep(1.0)  # idle keep-alive connections close, executor threads finish
    return proc_sample(s.proc.pid, t0)
