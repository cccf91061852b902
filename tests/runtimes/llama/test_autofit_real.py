"""Auto-fit context with the real llama.cpp runtime: on this machine's default
budget SmolLM2 loads with its trained context (8,192), not a fixed 4,096."""

from __future__ import annotations

from pathlib import Path

from app.compose import build_service
from app.core.library.gguf import read_header
from app.paths import AppPaths
from app.settings import SettingsStore


async def test_smollm2_loads_with_its_trained_context_on_the_default_budget(
    smollm2_path: Path, tmp_path: Path
) -> None:
    paths = AppPaths.default(tmp_path / "home").ensure()
    store = SettingsStore(paths.settings_file)
    assert store.load().load.context_length == 0  # "auto" is the default
    svc = build_service(paths, store.load())
    try:
        model, _ = svc.models.import_path(smollm2_path)
        trained = read_header(str(smollm2_path)).context_length
        est = svc.models.estimate(model.id)
        assert est["context_length"] == trained == 8192 and est["fits"]
        assert "trained length" in est["context_reason"]
        await svc.models._scheduler.load(model.id)
        (info,) = svc.models.loaded()
        assert info.context_length == trained  # what llama.cpp allocated (n_ctx)
        assert info.options.context_length == 0  # kept as auto: a later auto load is unchanged
        assert (await svc.models._scheduler.load_result(model.id, {})).action == "unchanged"
    finally:
        await svc.close()
