"""Each format object's answers: what a repo offers, where a download lands, when it is complete,
how it is installed and estimated, and how the library reads it. Real files under tmp_path."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.core.hub.downloads import DiskLayout, PullPlan
from app.core.library import fit, gguf
from app.core.library.formats import (
    FORMATS,
    GGUF,
    MLX,
    ModelOption,
    RepoFile,
    describe,
    estimate_model,
    format_named,
    partial_of,
    repo_format,
    tagged_format,
)
from app.core.library.gguf import GGUFHeader
from app.core.library.hardware import offload_gpus
from app.core.types import LoadOptions, LocalModel
from app.errors import InvalidModel, RepoRefused
from tests.support.fakehub import gguf_bytes, mlx_files
from tests.support.gguf_files import write_model

SHA = "a" * 64


def rf(path: str, size: int | None = 100) -> RepoFile:
    return RepoFile(path, size, SHA, None)


SHARDS = (rf("m-Q4_K_M-00001-of-00002.gguf", 300), rf("m-Q4_K_M-00002-of-00002.gguf", 200))
MLX_FILES = (rf("config.json", 50), rf("model.safetensors", 400), rf("tokenizer.json", 20))


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- which format, from the Hub --------------------------------------------------------------------
def test_the_registry_has_one_object_per_format_by_name() -> None:
    assert [f.name for f in FORMATS] == ["gguf", "mlx", "whisper"]
    assert format_named("whisper").search_tags == ("ctranslate2", "automatic-speech-recognition")
    assert format_named("gguf") is GGUF and format_named("mlx") is MLX
    assert (GGUF.label, MLX.label) == ("GGUF", "MLX")
    assert (GGUF.option_heading, MLX.option_heading) == ("Quantization", "Folder")
    with pytest.raises(KeyError):
        format_named("onnx")


def test_repo_format_prefers_gguf_files_over_an_mlx_tag() -> None:
    mlx_names = ["config.json", "model.safetensors"]
    assert repo_format(["Model-Q4_K_M.GGUF"], [], None) is GGUF
    assert repo_format([*mlx_names, "x.gguf"], ["mlx"], "mlx") is GGUF
    assert repo_format(mlx_names, ["mlx"], None) is MLX
    assert repo_format(mlx_names, [], "mlx") is MLX
    assert repo_format(mlx_names, [], "transformers") is None  # safetensors, but not MLX
    assert repo_format(["config.json"], ["mlx"], "mlx") is None  # no weights


def test_search_results_are_told_apart_by_tags_alone() -> None:
    assert tagged_format(["gguf", "mlx"], "mlx") is GGUF
    assert tagged_format(["mlx"], None) is MLX
    assert tagged_format([], "mlx") is MLX
    assert tagged_format(["transformers"], "transformers") is None


# -- what a repo offers ----------------------------------------------------------------------------
def test_gguf_offers_one_option_per_quantization_with_shards_summed() -> None:
    offer = GGUF.offer(
        [*SHARDS, rf("m-Q8_0.gguf", 900), rf("mmproj-f16.gguf")], config=None, tags=[]
    )
    assert offer.refused is None
    # the projector (mmproj) is not a model: each option fetches it too, its size added
    assert [(o.name, o.size_bytes, len(o.files)) for o in offer.options] == [
        ("Q4_K_M", 600, 2),
        ("Q8_0", 1000, 1),
    ]
    assert {o.projector.path for o in offer.options if o.projector} == {"mmproj-f16.gguf"}
    assert offer.options[0].sharded and not offer.options[1].sharded
    assert GGUF.sharded(SHARDS) and not GGUF.sharded(SHARDS[:1])


def test_gguf_with_no_model_file_is_refused_and_missing_shards_are_noted() -> None:
    offer = GGUF.offer([SHARDS[0], rf("mmproj-f16.gguf")], config=None, tags=[])
    assert offer.options == ()
    assert offer.refused == "this repo has no usable GGUF model files"
    assert offer.notes == ("m-Q4_K_M: shards missing (1 of 2); skipped",)


def test_mlx_offers_the_folder_it_needs_as_one_option_never_sharded() -> None:
    files = [*MLX_FILES, rf("README.md"), rf("modeling.py"), rf("pytorch_model.bin")]
    offer = MLX.offer(files, config={"quantization": {"bits": 4}}, tags=["mlx"])
    assert offer.refused is None
    (opt,) = offer.options
    assert (opt.name, opt.format, opt.quantization, opt.size_bytes) == ("mlx", "mlx", "4bit", 470)
    assert [f.path for f in opt.files] == ["config.json", "model.safetensors", "tokenizer.json"]
    assert not opt.sharded and not MLX.sharded(opt.files)


@pytest.mark.parametrize(
    ("config", "tags"),
    [({"auto_map": {"AutoModel": "x.Y"}}, []), ({"model_file": "m.py"}, []), ({}, ["custom_code"])],
)
def test_mlx_that_would_run_repo_code_is_refused(config: dict, tags: list[str]) -> None:
    offer = MLX.offer(MLX_FILES, config=config, tags=tags)
    assert offer.options == ()
    assert offer.refused is not None and offer.refused.startswith("refusing this MLX repo: ")


def test_option_labels() -> None:
    q4 = ModelOption("Q4_K_M", "gguf", "Q4_K_M", SHARDS, 500)
    folder = ModelOption("mlx", "mlx", "4bit", MLX_FILES, 470)
    assert GGUF.option_label("o/m-GGUF", q4) == "Q4_K_M"
    assert MLX.option_label("o/m-4bit", folder) == "m-4bit/ (MLX folder, 4bit)"
    assert (
        MLX.option_label("o/m", ModelOption("mlx", "mlx", None, MLX_FILES, 1)) == "m/ (MLX folder)"
    )


# -- memory before the download --------------------------------------------------------------------
def test_mlx_estimates_from_sizes_without_reading_a_header() -> None:
    async def no_header(f: RepoFile) -> GGUFHeader:
        raise AssertionError("an MLX folder has no GGUF header")

    opt = ModelOption("mlx", "mlx", None, MLX_FILES, 470)
    est = asyncio.run(MLX.estimate_remote(opt, no_header, context_length=1024))
    assert est == fit.MemoryEstimate(470, 0, 0, fit.MLX_OVERHEAD, 1024)


def test_gguf_estimates_from_the_first_file_header_and_shards_count_every_byte(
    tmp_path: Path,
) -> None:
    data = gguf_bytes(tmp_path, elems=4096)
    header = gguf.parse_header(data, file_size=len(data))
    asked: list[str] = []

    async def read(f: RepoFile) -> GGUFHeader:
        asked.append(f.path)
        return header

    single = ModelOption("Q4_K_M", "gguf", "Q4_K_M", (rf("m-Q4_K_M.gguf", len(data)),), len(data))
    one = asyncio.run(GGUF.estimate_remote(single, read, context_length=512))
    assert one == fit.estimate_gguf(header, context_length=512)
    sharded = ModelOption("Q4_K_M", "gguf", "Q4_K_M", SHARDS, 10**9)
    many = asyncio.run(GGUF.estimate_remote(sharded, read, context_length=512))
    assert asked == ["m-Q4_K_M.gguf", SHARDS[0].path]
    assert many.weights == 10**9  # not the first shard's own tensors
    assert (many.kv_cache, many.compute, many.overhead) == (one.kv_cache, one.compute, one.overhead)


# -- where a download lands ------------------------------------------------------------------------
def test_gguf_files_land_beside_each_other_in_the_repo_folder(tmp_path: Path) -> None:
    plan = PullPlan("o/m-GGUF", "c0ffee", "gguf", "Q4_K_M", "Q4_K_M", SHARDS)
    lay = DiskLayout(tmp_path, plan)
    repo = tmp_path / "o" / "m-GGUF"
    assert plan.name == SHARDS[0].path
    assert lay.target == repo / SHARDS[0].path
    assert lay.staging == repo
    assert lay.final(SHARDS[1]) == repo / SHARDS[1].path
    assert lay.partial(SHARDS[1]) == repo / f".{SHARDS[1].path}.partial"
    assert lay.sidecar == repo / f".{SHARDS[0].path}.partial.json"
    assert lay.lock_path == repo / f".{SHARDS[0].path}.lock"
    assert GGUF.folders(lay.target, SHARDS) == []
    # a file in a repo subfolder lands flat, under its base name
    nested = PullPlan("o/m", "c0ffee", "gguf", "Q8_0", "Q8_0", (rf("q8/m-Q8_0.gguf"),))
    assert DiskLayout(tmp_path, nested).target == tmp_path / "o" / "m" / "m-Q8_0.gguf"


def test_an_mlx_folder_is_assembled_hidden_beside_its_target(tmp_path: Path) -> None:
    plan = PullPlan("o/m-4bit", "c0ffee", "mlx", "mlx", "4bit", MLX_FILES)
    lay = DiskLayout(tmp_path, plan)
    repo = tmp_path / "o" / "m-4bit"
    assert plan.name == "m-4bit"
    assert lay.target == repo
    assert lay.staging == tmp_path / "o" / ".m-4bit.partial"
    assert lay.final(MLX_FILES[1]) == lay.staging / "model.safetensors"
    assert lay.sidecar == tmp_path / "o" / ".m-4bit.partial.json"
    assert MLX.folders(lay.target, MLX_FILES) == [lay.staging]
    lay.prepare()
    assert lay.staging.is_dir() and not repo.exists()


def test_a_plan_record_with_an_unknown_format_is_refused() -> None:
    plan = PullPlan("o/m", "c0ffee", "gguf", "Q8_0", "Q8_0", (rf("m-Q8_0.gguf"),))
    d = plan.to_dict()
    assert PullPlan.from_dict(d) == plan
    with pytest.raises(ValueError, match="bad format"):
        PullPlan.from_dict({**d, "format": "onnx"})


# -- completion, install, discard ------------------------------------------------------------------
def test_gguf_is_installed_only_with_every_shard_at_its_size_and_no_partial(tmp_path: Path) -> None:
    target = tmp_path / SHARDS[0].path
    assert not GGUF.installed(target, SHARDS)
    write(tmp_path / SHARDS[0].path, b"x" * 300)
    write(tmp_path / SHARDS[1].path, b"x" * 199)
    assert not GGUF.installed(target, SHARDS)  # the second shard is short
    write(tmp_path / SHARDS[1].path, b"x" * 200)
    assert GGUF.installed(target, SHARDS)
    write(partial_of(tmp_path / SHARDS[1].path), b"")
    assert not GGUF.installed(target, SHARDS)  # a newer download of it is under way


def test_gguf_install_renames_the_first_shard_last(tmp_path: Path) -> None:
    target = tmp_path / SHARDS[0].path
    for f in SHARDS:
        write(partial_of(tmp_path / f.path), b"x" * (f.size or 0))
    # the second shard cannot be renamed (a folder is in its way): the first must still be partial
    (tmp_path / SHARDS[1].path / "blocker").mkdir(parents=True)
    with pytest.raises(OSError):
        GGUF.install(target, SHARDS)
    assert not target.exists() and partial_of(target).exists()
    (tmp_path / SHARDS[1].path / "blocker").rmdir()
    (tmp_path / SHARDS[1].path).rmdir()
    GGUF.install(target, SHARDS)
    assert GGUF.installed(target, SHARDS)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.path for f in SHARDS)


def test_gguf_discard_leaves_the_shared_repo_folder_alone(tmp_path: Path) -> None:
    other = write(tmp_path / "other-Q8_0.gguf", b"keep")
    GGUF.discard(tmp_path / SHARDS[0].path)
    assert other.read_bytes() == b"keep"


def _stage_mlx(target: Path, files: dict[str, bytes]) -> tuple[RepoFile, ...]:
    staging = MLX.staging(target)
    out = []
    for name, data in files.items():
        write(partial_of(staging / name), data)
        out.append(RepoFile(name, len(data), SHA, None))
    return tuple(out)


def test_mlx_install_renames_the_folder_whole_and_replaces_an_earlier_pull(tmp_path: Path) -> None:
    target = tmp_path / "o" / "m"
    files = _stage_mlx(target, mlx_files())
    assert not MLX.installed(target, files)
    MLX.install(target, files)
    assert MLX.installed(target, files)
    assert not MLX.staging(target).exists()
    assert sorted(p.name for p in target.iterdir()) == sorted(f.path for f in files)
    # pulled again (a new commit): the old folder is swapped out, nothing of it is left
    write(target / "stale.txt", b"old")
    files = _stage_mlx(target, mlx_files(weights=8))
    MLX.install(target, files)
    assert MLX.installed(target, files) and not (target / "stale.txt").exists()
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["m"]


def test_mlx_install_refuses_a_downloaded_config_that_asks_for_code(tmp_path: Path) -> None:
    target = tmp_path / "o" / "m"
    files = _stage_mlx(
        target, {**mlx_files(), "config.json": json.dumps({"auto_map": {"A": "b.C"}}).encode()}
    )
    with pytest.raises(RepoRefused, match="refusing o/m: config.json: its config has an auto_map"):
        MLX.install(target, files)
    assert not target.exists() and not MLX.staging(target).exists()


def test_mlx_discard_removes_the_staging_folder(tmp_path: Path) -> None:
    target = tmp_path / "o" / "m"
    _stage_mlx(target, mlx_files())
    MLX.discard(target)
    assert not MLX.staging(target).exists()
    MLX.discard(target)  # nothing left: still fine


# -- the library -----------------------------------------------------------------------------------
def test_describe_reads_a_gguf_file_and_a_suffixless_blob_only_when_declared(
    tmp_path: Path,
) -> None:
    path = write_model(tmp_path / "tiny.gguf")
    meta = describe(path)
    assert (meta["format"], meta["name"], meta["context_length"]) == ("gguf", "Tiny Test", 2048)
    blob = write(tmp_path / "sha256-0123", path.read_bytes())
    with pytest.raises(InvalidModel, match="not a .gguf file"):
        describe(blob)
    assert describe(blob, format="gguf")["format"] == "gguf"
    with pytest.raises(InvalidModel, match="does not exist"):
        GGUF.describe(tmp_path / "missing.gguf")


def test_describe_reads_an_mlx_folder(tmp_path: Path) -> None:
    folder = tmp_path / "m-4bit"
    for name, data in mlx_files().items():
        write(folder / name, data)
    meta = describe(folder)
    assert (meta["format"], meta["name"], meta["quantization"]) == ("mlx", "m-4bit", "4bit")
    assert meta["architecture"] == "llama" and meta["context_length"] == 2048
    assert meta["chat_template"] == "{{ messages }}"
    (folder / "model.safetensors").unlink()
    with pytest.raises(InvalidModel, match="not a model folder"):
        describe(folder)


def test_estimate_model_asks_the_model_s_format(tmp_path: Path) -> None:
    path = write_model(tmp_path / "tiny.gguf")
    folder = tmp_path / "m"
    for name, data in mlx_files().items():
        write(folder / name, data)
    opts = LoadOptions(context_length=256)

    def local(p: Path, fmt: str) -> LocalModel:
        return LocalModel(id=p.name, path=str(p), format=fmt, size_bytes=0, owned=False)  # type: ignore[arg-type]

    g = estimate_model(local(path, "gguf"), opts)
    assert g == fit.estimate_gguf(
        gguf.read_header(path),
        context_length=256,
        kv_type=opts.kv_type,
        # a prompt piece's rows on the CPU, a whole batch where a GPU may take the layers
        batch_size=opts.batch_size if offload_gpus() else fit.CPU_PROMPT_PIECE,
        flash_attention=False,  # "auto": off on CPU, and the larger buffer where it may be on
        embedding=False,
        parallel=opts.parallel,
        prompt_cache="reuse",
    )
    assert estimate_model(local(folder, "mlx"), opts) == fit.estimate_mlx(
        str(folder), context_length=256
    )
