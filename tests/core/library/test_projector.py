"""Vision projectors from pull, import and scan: the one match check, the Hub
option's projector, a pull that fetches and pairs it (or refuses it with the reason), and
import / models-folder scans that pair a projector lying next to a model.

Real parts: GGUF files written with the ``gguf`` writer (tiny models of embedding size 64, the
real tiny projector of tests/support/vision_gguf.py with its output size set), the real library, the
real DownloadManager and huggingface_hub against the fake Hub.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.core.events import EventHub
from app.core.hub import HubClient
from app.core.hub.downloads import DownloadManager
from app.core.hub.downloads.manager import DownloadPolicy
from app.core.library.formats import RepoFile, group_gguf
from app.core.library.index import ModelLibrary
from app.core.library.projector import pair_in_folder, projector_problem, projector_rank
from app.errors import ChecksumMismatch
from tests.support.fakehub import FakeHub, gguf_bytes
from tests.support.vision_gguf import write_projector

N_EMBD = 64  # gguf_bytes' models


def model_file(path: Path, *, embedding: int = N_EMBD, name: str = "Tiny") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gguf_bytes(path.parent / ".build", name=name, embedding=embedding))
    return path


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("projectors")
    return {
        "good": write_projector(d / "good.gguf", projection_dim=N_EMBD).read_bytes(),
        "wide": write_projector(d / "wide.gguf", projection_dim=576).read_bytes(),
    }


# -- the one check ---------------------------------------------------------------------------------
def test_the_match_check_says_why(tmp_path: Path, projectors: dict[str, bytes]) -> None:
    model = model_file(tmp_path / "m-Q4_K_M.gguf")
    good, wide = tmp_path / "mmproj-good.gguf", tmp_path / "mmproj-wide.gguf"
    good.write_bytes(projectors["good"])
    wide.write_bytes(projectors["wide"])
    assert projector_problem(model, good) is None
    why = projector_problem(model, wide)
    assert why is not None and "embedding size 576 does not match the model's 64" in why
    other = model_file(tmp_path / "mmproj-not.gguf", name="text")  # a text model so named
    assert "is not a vision projector" in (projector_problem(model, other) or "")
    broken = tmp_path / "mmproj-broken.gguf"
    broken.write_bytes(projectors["good"][:100])
    assert "not a valid GGUF" in (projector_problem(model, broken) or "")


def test_the_rule_picks_the_projector_of_the_model() -> None:
    def best(names: list[tuple[str, int]], model: str) -> str:
        return min(names, key=lambda n: projector_rank(n[0], n[1], model))[0]

    # F16 over F32, whatever the size
    assert best([("mmproj-F32.gguf", 10), ("mmproj-F16.gguf", 20)], "m-Q4_K_M.gguf") == (
        "mmproj-F16.gguf"
    )
    # one naming this model over a generic one over one naming another model
    names = [("mmproj-other-7b-F16.gguf", 1), ("mmproj-F16.gguf", 2), ("mmproj-m-3b-F32.gguf", 3)]
    assert best(names, "m-3b-Q4_K_M.gguf") == "mmproj-m-3b-F32.gguf"
    assert best(names[:2], "m-3b-Q4_K_M.gguf") == "mmproj-F16.gguf"
    # the model's own quantization first, then the smallest
    assert best([("mmproj-F16.gguf", 5), ("mmproj-Q8_0.gguf", 3)], "m-Q8_0.gguf") == (
        "mmproj-Q8_0.gguf"
    )
    assert best([("mmproj-a.gguf", 5), ("mmproj-b.gguf", 3)], "m.gguf") == "mmproj-b.gguf"


def test_hub_options_carry_the_projector_in_their_size_and_json() -> None:
    def rf(path: str, size: int) -> RepoFile:
        return RepoFile(path, size, "a" * 64, None)

    options, _ = group_gguf(
        [rf("m-Q4_K_M.gguf", 400), rf("mmproj-m-F32.gguf", 80), rf("mmproj-m-F16.gguf", 40)]
    )
    (opt,) = options
    assert opt.size_bytes == 440 and opt.model_bytes == 400
    assert opt.as_dict()["projector"] == {"file": "mmproj-m-F16.gguf", "size": 40}
    assert opt.as_dict()["files"] == ["m-Q4_K_M.gguf"]
    (plain,), _ = group_gguf([rf("m-Q4_K_M.gguf", 400)])
    assert plain.as_dict()["projector"] is None and plain.size_bytes == 400


# -- import and scans ------------------------------------------------------------------------------
def test_import_pairs_a_matching_projector_and_says_why_not_otherwise(
    tmp_path: Path, projectors: dict[str, bytes]
) -> None:
    folder = tmp_path / "lmstudio" / "acme"
    small = model_file(folder / "small-Q4_K_M.gguf")
    wide = model_file(folder / "wide-Q4_K_M.gguf", embedding=576, name="wide")
    proj = folder / "mmproj-F16.gguf"
    proj.write_bytes(projectors["good"])  # one projector for two models: pairs with its match
    lib = ModelLibrary(tmp_path / "data" / "library.json", tmp_path / "models")
    a, _ = lib.import_path(small)
    b, _ = lib.import_path(wide)
    assert a.extra["projector"] == str(proj) and "vision" in a.capabilities
    assert a.summary()["projector"] == {"path": str(proj), "size": len(projectors["good"])}
    assert "projector" not in b.extra and "vision" not in b.capabilities
    assert b.summary()["projector"] is None
    assert "embedding size 64 does not match the model's 576" in b.extra["projector_refused"]
    # the best matching one of several
    (folder / "mmproj-F32.gguf").write_bytes(projectors["good"])
    assert pair_in_folder(small).projector == proj


def test_the_models_folder_scan_pairs_and_never_lists_a_projector(
    tmp_path: Path, projectors: dict[str, bytes]
) -> None:
    repo = tmp_path / "models" / "acme" / "tiny-GGUF"
    model_file(repo / "tiny-Q4_K_M.gguf")
    model_file(repo / "tiny-Q8_0.gguf")
    (repo / "mmproj-tiny-F16.gguf").write_bytes(projectors["good"])
    lib = ModelLibrary(tmp_path / "data" / "library.json", tmp_path / "models")
    models = lib.list()
    assert sorted(m.id for m in models) == ["tiny-q4_k_m", "tiny-q8_0"]  # not the projector
    assert {m.extra.get("projector") for m in models} == {str(repo / "mmproj-tiny-F16.gguf")}


# -- pull ------------------------------------------------------------------------------------------
def _manager(hub: FakeHub, root: Path) -> DownloadManager:
    lib = ModelLibrary(root / "data" / "library.json", root / "models")
    return DownloadManager(
        lib,
        HubClient(endpoint=hub.endpoint),
        EventHub(),
        policy=DownloadPolicy(backoff_base=0.05, lock_poll=0.05, progress_interval=0.0),
    )


async def test_pull_fetches_verifies_and_pairs_the_projector(
    fake_hub: FakeHub, tmp_path: Path, projectors: dict[str, bytes]
) -> None:
    b = tmp_path / "build"
    fake_hub.add_repo(
        "acme/see-GGUF",
        {
            "see-Q4_K_M.gguf": gguf_bytes(b, elems=20_000),
            "see-Q8_0.gguf": gguf_bytes(b, file_type=7, elems=30_000),
            "mmproj-see-F16.gguf": projectors["good"],
        },
        tags=["gguf"],
    )
    dm = _manager(fake_hub, tmp_path)
    info = await dm.hub.repo("acme/see-GGUF", with_fit=False)
    assert all(o.projector and o.projector.path == "mmproj-see-F16.gguf" for o in info.options)
    # the projector's byte flipped on the wire: the same sha256 check as the model's
    fake_hub.fault("acme/see-GGUF", "mmproj-see-F16.gguf", flip=1000)
    with pytest.raises(ChecksumMismatch, match="mmproj-see-F16.gguf"):
        await dm.pull("acme/see-GGUF:Q4_K_M")
    assert dm.library.list() == []  # nothing entered the library
    # two quantizations at once share the projector file: one fetch of it, both paired
    fetched = len(fake_hub.file_requests("acme/see-GGUF", "mmproj-see-F16.gguf"))
    gate = fake_hub.hold("acme/see-GGUF", "mmproj-see-F16.gguf", at=1000)
    pulls = asyncio.gather(dm.pull("acme/see-GGUF:Q4_K_M"), dm.pull("acme/see-GGUF:Q8_0"))
    await gate.wait_async(timeout=20)
    for _ in range(500):  # the other download waits for the projector's lock (gated: no timing)
        if sorted(s.state for s in dm.list()) == ["downloading", "waiting"]:
            break
        await asyncio.sleep(0.02)
    assert sorted(s.state for s in dm.list()) == ["downloading", "waiting"]
    gate.open()
    q4, q8 = await pulls
    assert len(fake_hub.file_requests("acme/see-GGUF", "mmproj-see-F16.gguf")) == fetched + 1
    proj = tmp_path / "models" / "acme" / "see-GGUF" / "mmproj-see-F16.gguf"
    assert proj.read_bytes() == projectors["good"]
    for m in (q4, q8):
        assert m.extra["projector"] == str(proj.resolve()) and "vision" in m.capabilities
        assert m.extra["hub"]["projector"] == "mmproj-see-F16.gguf"
    assert not [p.name for p in proj.parent.iterdir() if p.name.startswith(".")]
    listed = {m.id: m.summary()["projector"] for m in dm.library.list()}
    assert listed == {
        q4.id: {"path": str(proj.resolve()), "size": len(projectors["good"])},
        q8.id: {"path": str(proj.resolve()), "size": len(projectors["good"])},
    }
    await dm.close()


async def test_a_pulled_projector_that_does_not_match_is_refused_with_the_reason(
    fake_hub: FakeHub, tmp_path: Path, projectors: dict[str, bytes]
) -> None:
    b = tmp_path / "build"
    fake_hub.add_repo(
        "acme/wrong-GGUF",
        {"wrong-Q4_K_M.gguf": gguf_bytes(b), "mmproj-wrong-F16.gguf": projectors["wide"]},
        tags=["gguf"],
    )
    dm = _manager(fake_hub, tmp_path)
    model = await dm.pull("acme/wrong-GGUF")
    assert "projector" not in model.extra and "vision" not in model.capabilities
    assert "embedding size 576 does not match the model's 64" in model.extra["projector_refused"]
    index = json.loads(dm.library.index_file.read_text())
    assert "projector" not in index["models"][0]["extra"]
    await dm.close()


def test_a_plans_record_keeps_its_projector_and_refuses_a_forged_one() -> None:
    from app.core.hub.downloads.plan import PullPlan

    model = RepoFile("m-Q4_K_M.gguf", 400, "a" * 64, None)
    proj = RepoFile("mmproj-m-F16.gguf", 40, "b" * 64, None)
    plan = PullPlan("acme/m-GGUF", "c" * 40, "gguf", "Q4_K_M", "Q4_K_M", (model, proj), proj.path)
    again = PullPlan.from_dict(json.loads(json.dumps(plan.to_dict())))  # the sidecar's round trip
    assert again == plan and again.model_files == (model,) and again.projector_file == proj
    for forged in ("m-Q4_K_M.gguf", "mmproj-other.gguf"):  # the model itself; not in the plan
        with pytest.raises(ValueError, match="bad projector"):
            PullPlan.from_dict({**plan.to_dict(), "projector": forged})
