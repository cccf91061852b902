"""HubClient against the local fake Hub through the real huggingface_hub: search, repo view,
quantization grouping, remote GGUF headers and fit verdicts, refusals (SECURITY.md 15-16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.hub import (
    HubClient,
    HubRef,
    RepoFile,
    assess,
    check_repo_path,
    choices,
    choose,
    group_gguf,
    parse_ref,
    quant_of,
    size_range,
)
from app.core.library.fit import DeviceMemory
from app.errors import AccessDenied, AmbiguousChoice, RepoNotFound, RepoRefused
from tests.support.fakehub import TOKEN, FakeHub, gguf_bytes, mlx_files

GiB = 1 << 30
BIG_MACHINE = DeviceMemory(64 * GiB, 48 * GiB)
SMALL_MACHINE = DeviceMemory(512 << 20, 8 << 20)  # 8 MB free: nothing fits
GPU_MACHINE = DeviceMemory(64 * GiB, 48 * GiB, (("Fake GPU", 24 * GiB),))


def client(hub: FakeHub, **kw: object) -> HubClient:
    kw.setdefault("memory_probe", lambda: BIG_MACHINE)
    return HubClient(endpoint=hub.endpoint, **kw)  # type: ignore[arg-type]


# -- names and references -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bartowski/Qwen2.5-0.5B-Instruct-GGUF", HubRef("bartowski/Qwen2.5-0.5B-Instruct-GGUF")),
        ("acme/tiny-GGUF:q8_0", HubRef("acme/tiny-GGUF", quant="q8_0")),
        ("acme/tiny-GGUF/tiny-Q4_K_M.gguf", HubRef("acme/tiny-GGUF", filename="tiny-Q4_K_M.gguf")),
        ("acme/tiny-GGUF/Q4/part.gguf", HubRef("acme/tiny-GGUF", filename="Q4/part.gguf")),
        ("hf.co/acme/tiny-GGUF:Q4_K_M", HubRef("acme/tiny-GGUF", quant="Q4_K_M")),
        ("https://huggingface.co/acme/tiny-GGUF", HubRef("acme/tiny-GGUF")),
        ("https://huggingface.co/acme/tiny-GGUF/", HubRef("acme/tiny-GGUF")),
        (
            "https://huggingface.co/acme/tiny-GGUF/blob/main/tiny-Q8_0.gguf",
            HubRef("acme/tiny-GGUF", revision="main", filename="tiny-Q8_0.gguf"),
        ),
        (
            "https://huggingface.co/acme/tiny-GGUF/resolve/abc123/tiny-Q8_0.gguf?download=true",
            HubRef("acme/tiny-GGUF", revision="abc123", filename="tiny-Q8_0.gguf"),
        ),
        ("https://hf.co/acme/tiny-GGUF/tree/main", HubRef("acme/tiny-GGUF", revision="main")),
    ],
)
def test_parse_ref(text: str, expected: HubRef) -> None:
    assert parse_ref(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "justaname",
        "../etc/passwd",
        "acme/../../etc",
        "acme/..",
        "/abs/path",
        "C:\\models\\x",
        "\\\\server\\share\\x",
        "acme/ti\x00ny",
        "acme/tiny-GGUF/../x.gguf",
        "acme/tiny-GGUF/./x.gguf",
        "acme/tiny-GGUF:",
        "https://evil.example.com/acme/tiny-GGUF",
        "ftp://huggingface.co/acme/tiny",
        "acme/tiny--x",
    ],
)
def test_parse_ref_refuses_hostile(text: str) -> None:
    with pytest.raises(RepoRefused):
        parse_ref(text)


@pytest.mark.parametrize(
    "name",
    [
        "../x.gguf",
        "a/../../x.gguf",
        "/abs.gguf",
        "C:\\x.gguf",
        "C:x.gguf",
        "\\\\server\\share\\x.gguf",
        "dir\\x.gguf",
        "x\x00.gguf",
        "x\n.gguf",
        ".hidden.gguf",
        "a//b.gguf",
        "",
        "a/./b.gguf",
        "x" * 300 + ".gguf",
    ],
)
def test_check_repo_path_refuses(name: str) -> None:
    with pytest.raises(RepoRefused):
        check_repo_path(name)


def test_check_repo_path_accepts_plain_names() -> None:
    for ok in ("model-Q4_K_M.gguf", "Q4_K_M/model-00001-of-00002.gguf", "config.json"):
        assert check_repo_path(ok) == ok


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "Q8_0"),
        ("model.IQ4_XS.gguf", "IQ4_XS"),
        ("model-IQ2_XXS.gguf", "IQ2_XXS"),
        ("model-f16.gguf", "F16"),
        ("model-BF16.gguf", "BF16"),
        ("model_Q5_K_S.gguf", "Q5_K_S"),
        ("model-Q6_K.gguf", "Q6_K"),
        ("Qwen3-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Q4_K_M/model-00001-of-00002.gguf", None),  # the folder names it, not the file
        ("model-fp16.gguf", "F16"),
        ("model.gguf", None),
        ("MQ4_K_M.gguf", None),  # not a separate token
    ],
)
def test_quant_of(name: str, quant: str | None) -> None:
    assert quant_of(name) == quant


def rf(path: str, size: int = 100) -> RepoFile:
    return RepoFile(path, size, "a" * 64, None)


def test_group_gguf_shards_are_one_option_with_summed_size() -> None:
    files = [
        rf("m-Q4_K_M.gguf", 400),
        rf("m-Q8_0-00002-of-00003.gguf", 500),
        rf("m-Q8_0-00001-of-00003.gguf", 600),
        rf("m-Q8_0-00003-of-00003.gguf", 700),
        rf("m-F16-00001-of-00002.gguf", 900),  # incomplete: shard 2 missing
        rf("mmproj-m-f16.gguf", 50),  # a vision projector, not a model: fetched with each
        rf("README.md", 10),
    ]
    options, notes = group_gguf(files)
    by_name = {o.name: o for o in options}
    assert set(by_name) == {"Q4_K_M", "Q8_0"}
    q8 = by_name["Q8_0"]
    assert q8.size_bytes == 1800 + 50 and q8.model_bytes == 1800 and q8.sharded
    assert q8.projector is not None and q8.projector.path == "mmproj-m-f16.gguf"
    assert [f.path for f in q8.files] == [
        "m-Q8_0-00001-of-00003.gguf",
        "m-Q8_0-00002-of-00003.gguf",
        "m-Q8_0-00003-of-00003.gguf",
    ]
    assert any("missing" in n for n in notes)
    assert [o.name for o in options] == ["Q4_K_M", "Q8_0"]  # smallest first


def test_size_range_smallest_and_largest_option() -> None:
    files = [
        rf("m-Q4_K_M.gguf", 400),
        rf("m-Q8_0-00002-of-00003.gguf", 500),  # a sharded quantization counts as its sum
        rf("m-Q8_0-00001-of-00003.gguf", 600),
        rf("m-Q8_0-00003-of-00003.gguf", 700),
        rf("m-F16-00001-of-00002.gguf", 9000),  # incomplete: not an option, not in the range
        rf("mmproj-m-f16.gguf", 50),  # a projector is not a model; each option includes it
        rf("README.md", 10),
    ]
    options, _ = group_gguf(files)
    assert size_range(options) == (450, 1850)
    assert size_range(options[:1]) == (450, 450)
    assert size_range([]) is None
    # a file whose size the Hub did not give leaves its option out of the range
    unknown, _ = group_gguf([rf("a-Q4_K_M.gguf", 400), RepoFile("a-Q8_0.gguf", None, None, None)])
    assert size_range(unknown) == (400, 400)
    nothing, _ = group_gguf([RepoFile("a-Q8_0.gguf", None, None, None)])
    assert size_range(nothing) is None
    # MLX: one folder, its weights plus config and tokenizer (what the download is)
    mlx = [
        rf("config.json", 100),
        rf("model-00001-of-00002.safetensors", 3000),
        rf("model-00002-of-00002.safetensors", 2000),
        rf("tokenizer.json", 50),
        rf("README.md", 7),
    ]
    fmt, mlx_options, refused, _ = assess(mlx, tags=["mlx"], library_name="mlx")
    assert fmt == "mlx" and refused is None
    assert size_range(mlx_options) == (5150, 5150)


def test_group_gguf_same_quant_twice_is_named_by_file() -> None:
    options, _ = group_gguf([rf("a-Q4_K_M.gguf"), rf("b-Q4_K_M.gguf"), rf("plain.gguf")])
    assert sorted(o.name for o in options) == ["a-Q4_K_M", "b-Q4_K_M", "plain"]
    assert {o.quantization for o in options} == {"Q4_K_M", None}


# -- against the fake Hub -----------------------------------------------------------------------
@pytest.fixture
def repos(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    b = tmp_path / "build"
    fake_hub.add_repo(
        "acme/tiny-GGUF",
        {
            "tiny-Q4_K_M.gguf": gguf_bytes(b, elems=4096),
            "tiny-Q8_0.gguf": gguf_bytes(b, file_type=7, elems=8192),
            "README.md": b"---\nlicense: mit\n---\n# Tiny\n\nA tiny model.\n",
        },
        tags=["gguf", "license:mit", "text-generation"],
        card_data={"license": "mit"},
        downloads=500,
        likes=3,
        last_modified="2025-03-01T00:00:00.000Z",
        created_at="2024-05-01T00:00:00.000Z",
        card="---\nlicense: mit\n---\n# Tiny\n\nA tiny model.\n",
    )
    fake_hub.add_repo(
        "acme/popular-GGUF",
        {"pop-Q4_K_M.gguf": gguf_bytes(b, name="pop")},
        tags=["gguf"],
        downloads=9000,
        likes=1,
        last_modified="2024-01-01T00:00:00.000Z",
        created_at="2023-01-01T00:00:00.000Z",
    )
    fake_hub.add_repo(
        "other/liked-GGUF",
        {"liked-Q4_K_M.gguf": gguf_bytes(b, name="liked")},
        tags=["gguf"],
        downloads=10,
        likes=999,
        gated="manual",
        last_modified="2025-06-01T00:00:00.000Z",
        created_at="2025-06-01T00:00:00.000Z",
    )
    fake_hub.add_repo(
        "other/secret-GGUF",
        {"secret-Q4_K_M.gguf": gguf_bytes(b, name="secret")},
        tags=["gguf"],
        private=True,
        downloads=1,
    )
    fake_hub.add_repo(
        "mlx-community/tiny-4bit",
        mlx_files(),
        tags=["mlx"],
        library_name="mlx",
        downloads=20,
        config={"model_type": "llama", "quantization": {"bits": 4, "group_size": 64}},
    )
    fake_hub.add_repo(
        "acme/pickle-only", {"pytorch_model.bin": b"\x80\x04pickle", "config.json": b"{}"}
    )
    return fake_hub


async def test_search_sorts_and_marks(repos: FakeHub) -> None:
    c = client(repos)
    by_dl = await c.search("GGUF", sort="downloads")
    assert [m.id for m in by_dl] == ["acme/popular-GGUF", "acme/tiny-GGUF", "other/liked-GGUF"]
    assert "other/secret-GGUF" not in [m.id for m in by_dl]  # private: invisible without token
    by_likes = await c.search("gguf", sort="likes", limit=2)
    assert [m.id for m in by_likes] == ["other/liked-GGUF", "acme/tiny-GGUF"]
    recent = await c.search("", sort="recent")
    assert recent[0].id == "other/liked-GGUF"
    liked = by_likes[0]
    assert liked.gated == "manual" and not liked.private
    tiny = next(m for m in by_dl if m.id == "acme/tiny-GGUF")
    assert tiny.license == "mit" and tiny.format == "gguf" and tiny.downloads == 500
    assert tiny.gated is False and tiny.last_modified is not None
    assert tiny.last_modified.year == 2025
    # the filter really reached the Hub: the request carried filter=gguf
    search_reqs = [s for s in repos.seen if s.path == "/api/models"]
    assert search_reqs
    mlx = await c.search("", format="mlx")
    assert [m.id for m in mlx] == ["mlx-community/tiny-4bit"] and mlx[0].format == "mlx"
    mine = await c.search("", author="acme")
    assert {m.id for m in mine} == {"acme/tiny-GGUF", "acme/popular-GGUF"}
    with_token = await client(repos, token=TOKEN).search("secret")
    assert [m.id for m in with_token] == ["other/secret-GGUF"] and with_token[0].private


async def test_search_results_get_their_size_range_from_each_repo(repos: FakeHub) -> None:
    c = client(repos)
    found = await c.search("", format=None, sort="downloads")
    # the search answer carries no sizes (as on the real Hub): unknown until the files are read
    assert all(m.size_range is None for m in found)
    assert all(m.as_dict()["size_range"] is None for m in found)
    search_reqs = [s for s in repos.seen if s.path == "/api/models"]
    info_reqs = [s for s in repos.seen if s.path.startswith("/api/models/")]
    assert search_reqs and not info_reqs
    sized = {m.id: m for m in await c.with_sizes(found)}
    assert [m.id for m in found] == list(sized)  # same order
    tiny = repos.repos["acme/tiny-GGUF"].files
    q4, q8 = len(tiny["tiny-Q4_K_M.gguf"].data), len(tiny["tiny-Q8_0.gguf"].data)
    assert q4 < q8
    assert sized["acme/tiny-GGUF"].size_range == (q4, q8)
    assert sized["acme/tiny-GGUF"].as_dict()["size_range"] == [q4, q8]
    mlx_total = sum(len(f.data) for f in repos.repos["mlx-community/tiny-4bit"].files.values())
    assert sized["mlx-community/tiny-4bit"].size_range == (mlx_total, mlx_total)
    assert sized["acme/pickle-only"].size_range is None  # refused: nothing to download
    # gated: the file list is public, so its sizes are known without a token
    liked = len(repos.repos["other/liked-GGUF"].files["liked-Q4_K_M.gguf"].data)
    assert sized["other/liked-GGUF"].size_range == (liked, liked)
    # one repo lookup each; none again once the range is known (the pickle repo has none)
    before = len(repos.seen)
    again = await c.with_sizes(list(sized.values()))
    assert again == list(sized.values())
    assert [s.path for s in repos.seen[before:]] == ["/api/models/acme/pickle-only"]
    assert await c.repo_size_range("acme/tiny-GGUF") == (q4, q8)


async def test_a_repo_that_vanished_keeps_no_size_range(repos: FakeHub) -> None:
    c = client(repos)
    found = await c.search("tiny", format="gguf")
    del repos.repos["acme/tiny-GGUF"]
    assert [m.size_range for m in await c.with_sizes(found)] == [None]
    with pytest.raises(RepoNotFound):
        await c.repo_size_range("acme/tiny-GGUF")


def test_fake_hub_search_answers_expand_like_the_real_hub(repos: FakeHub) -> None:
    """What list_models(expand=...) can carry: names, parameter counts, whole-repo storage;
    never a file's size. Unknown properties are refused with a 400 as on the real Hub."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=repos.endpoint)
    (m,) = api.list_models(
        search="tiny-GGUF", expand=["siblings", "gguf", "usedStorage", "downloads"]
    )
    assert m.id == "acme/tiny-GGUF" and m.downloads == 500
    assert m.likes is None  # not asked for, not sent
    assert {s.rfilename for s in m.siblings or []} == set(repos.repos["acme/tiny-GGUF"].files)
    assert all(s.size is None and s.lfs is None for s in m.siblings or [])
    assert m.gguf is not None and m.gguf["total"] == 135_000_000  # parameters, not bytes
    assert m.used_storage == sum(len(f.data) for f in repos.repos["acme/tiny-GGUF"].files.values())
    with pytest.raises(HfHubHTTPError):
        list(api.list_models(expand=["fileSizes"]))  # type: ignore[list-item]


async def test_repo_view_options_sizes_and_fit(repos: FakeHub) -> None:
    info = await client(repos).repo("acme/tiny-GGUF")
    assert info.format == "gguf" and info.refused is None and info.license == "mit"
    assert info.revision == repos.repos["acme/tiny-GGUF"].sha
    assert [o.name for o in info.options] == ["Q4_K_M", "Q8_0"]
    q4 = info.option("Q4_K_M")
    assert q4.size_bytes == len(repos.repos["acme/tiny-GGUF"].files["tiny-Q4_K_M.gguf"].data)
    assert q4.first_file.sha256 == repos.repos["acme/tiny-GGUF"].files["tiny-Q4_K_M.gguf"].sha256
    assert q4.fit == "fits-ram" and q4.estimate is not None
    assert q4.estimate.weights == 4096 * 4  # from the remote header's tensor table
    assert q4.estimate.context_length == 2048  # capped at the trained context
    # the header came through an HTTP Range request, not a whole-file download
    ranges = repos.ranges("acme/tiny-GGUF", "tiny-Q4_K_M.gguf")
    assert ranges and all(r and r.startswith("bytes=0-") for r in ranges)
    assert (await client(repos).model_card("acme/tiny-GGUF")).startswith("# Tiny")


async def test_fit_verdict_follows_the_machine(repos: FakeHub) -> None:
    small = await client(repos, memory_probe=lambda: SMALL_MACHINE).repo("acme/tiny-GGUF")
    assert {o.fit for o in small.options} == {"too-large"}
    gpu = await client(repos, memory_probe=lambda: GPU_MACHINE).repo("acme/tiny-GGUF")
    assert {o.fit for o in gpu.options} == {"fits-gpu"}
    # a longer context costs more: the estimate grows with it
    short = await client(repos, context_length=256).repo("acme/tiny-GGUF")
    long = await client(repos, context_length=2048).repo("acme/tiny-GGUF")
    assert short.options[0].estimate and long.options[0].estimate
    assert short.options[0].estimate.total < long.options[0].estimate.total


async def test_remote_header_larger_than_the_first_read(fake_hub: FakeHub, tmp_path: Path) -> None:
    data = gguf_bytes(tmp_path, tokens=150_000, elems=1024)  # ~2.9 MB of header
    assert len(data) > 2 * 1024 * 1024
    fake_hub.add_repo("acme/vocab-GGUF", {"v-Q4_K_M.gguf": data}, tags=["gguf"])
    info = await client(fake_hub).repo("acme/vocab-GGUF")
    o = info.options[0]
    assert o.fit == "fits-ram", o.fit_error
    ranges = fake_hub.ranges("acme/vocab-GGUF", "v-Q4_K_M.gguf")
    assert ranges[0] == "bytes=0-2097151" and len(ranges) >= 2  # grew with a second Range read
    assert ranges[1].startswith("bytes=2097152-")


async def test_remote_header_when_the_server_ignores_range(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    fake_hub.add_repo(
        "acme/x-GGUF", {"x-Q8_0.gguf": gguf_bytes(tmp_path, file_type=7)}, tags=["gguf"]
    )
    fake_hub.fault("acme/x-GGUF", "x-Q8_0.gguf", ignore_range=True, times=-1)
    info = await client(fake_hub).repo("acme/x-GGUF")
    assert info.options[0].fit == "fits-ram"


async def test_sharded_option_in_repo_view(fake_hub: FakeHub, tmp_path: Path) -> None:
    first = gguf_bytes(tmp_path, elems=2048)
    fake_hub.add_repo(
        "acme/big-GGUF",
        {
            "Q8_0/big-Q8_0-00001-of-00002.gguf": first,
            "Q8_0/big-Q8_0-00002-of-00002.gguf": b"\0" * 5000,
            "big-Q4_K_M.gguf": gguf_bytes(tmp_path, name="b4"),
        },
        tags=["gguf"],
    )
    info = await client(fake_hub).repo("acme/big-GGUF")
    q8 = info.option("Q8_0")
    assert q8.sharded and q8.size_bytes == len(first) + 5000
    assert q8.estimate is not None and q8.estimate.weights == q8.size_bytes
    assert choose(info, quant="q8_0") is q8
    assert choose(info) == info.option("Q4_K_M")


async def test_choose_default_case_insensitive_and_ambiguous(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    b = tmp_path / "b"
    fake_hub.add_repo(
        "acme/two-GGUF",
        {"two-Q5_K_M.gguf": gguf_bytes(b), "two-Q8_0.gguf": gguf_bytes(b, file_type=7)},
        tags=["gguf"],
    )
    info = await client(fake_hub).repo("acme/two-GGUF", with_fit=False)
    assert choose(info, quant="q8_0").name == "Q8_0"
    assert choose(info, filename="two-Q5_K_M.gguf").name == "Q5_K_M"
    with pytest.raises(AmbiguousChoice) as e:
        choose(info)
    assert e.value.choices == ["acme/two-GGUF:Q5_K_M", "acme/two-GGUF:Q8_0"] == choices(info)
    with pytest.raises(AmbiguousChoice) as e2:
        choose(info, quant="IQ1_S")
    assert "Q5_K_M" in e2.value.message
    with pytest.raises(RepoNotFound):
        choose(info, filename="nope.gguf")


async def test_refuses_pickle_only_repo(repos: FakeHub) -> None:
    info = await client(repos).repo("acme/pickle-only")
    assert info.refused and "pickle" in info.refused and not info.options
    with pytest.raises(RepoRefused, match="pickle"):
        choose(info)


@pytest.mark.parametrize(
    ("config", "tags", "why"),
    [
        ({"model_type": "x", "auto_map": {"AutoModel": "modeling.X"}}, ["mlx"], "auto_map"),
        ({"model_type": "x", "model_file": "model.py"}, ["mlx"], "model_file"),
        ({"model_type": "x"}, ["mlx", "custom_code"], "custom_code"),
        (
            {"model_type": "x", "tokenizer_config": {"auto_map": {"AutoTokenizer": ["t.T", None]}}},
            ["mlx"],
            "tokenizer",
        ),
    ],
)
async def test_refuses_remote_code(
    fake_hub: FakeHub, config: dict[str, object], tags: list[str], why: str
) -> None:
    files = mlx_files(config=config)
    files["modeling.py"] = b"import os; os.system('echo pwned')"
    fake_hub.add_repo("evil/code-mlx", files, tags=tags, library_name="mlx", config=config)
    info = await client(fake_hub).repo("evil/code-mlx")
    assert info.refused and why in info.refused and not info.options


async def test_hostile_sibling_names_are_skipped(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo(
        "evil/names-GGUF",
        {"good-Q4_K_M.gguf": gguf_bytes(tmp_path)},
        tags=["gguf"],
        listed_only=["../evil-Q8_0.gguf", "/abs-Q8_0.gguf", "C:\\x-Q8_0.gguf", "a\x00-Q8_0.gguf"],
    )
    info = await client(fake_hub).repo("evil/names-GGUF", with_fit=False)
    assert [f.path for f in info.files] == ["good-Q4_K_M.gguf"]
    assert [o.name for o in info.options] == ["Q4_K_M"]
    assert len(info.warnings) == 4
    fake_hub.add_repo("evil/only-GGUF", {}, tags=["gguf"], listed_only=["../x.gguf", "/y.gguf"])
    bad = await client(fake_hub).repo("evil/only-GGUF", with_fit=False)
    assert bad.refused and "unsafe" in bad.refused


async def test_mlx_repo_is_one_folder_option_without_code(repos: FakeHub) -> None:
    info = await client(repos).repo("mlx-community/tiny-4bit")
    assert info.format == "mlx" and len(info.options) == 1
    o = info.options[0]
    assert o.name == "mlx" and o.quantization == "4bit" and o.fit == "fits-ram"
    assert sorted(f.path for f in o.files) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert o.size_bytes == sum(
        len(f.data) for f in repos.repos["mlx-community/tiny-4bit"].files.values()
    )


async def test_gated_and_private(repos: FakeHub) -> None:
    # gated: the metadata is public, the bytes are not; the fit says why it is unknown
    info = await client(repos).repo("other/liked-GGUF")
    assert info.gated == "manual" and info.options[0].fit is None
    assert "gated" in (info.options[0].fit_error or "")
    assert f"{repos.endpoint}/other/liked-GGUF" in (info.options[0].fit_error or "")
    with pytest.raises(AccessDenied) as e:
        await client(repos).check_access("other/liked-GGUF", "liked-Q4_K_M.gguf", revision="main")
    assert e.value.url == f"{repos.endpoint}/other/liked-GGUF"
    with pytest.raises(AccessDenied, match="cannot download"):  # a token without access
        await client(repos, token="hf_wrong").check_access(
            "other/liked-GGUF", "liked-Q4_K_M.gguf", revision="main"
        )
    ok = await client(repos, token=TOKEN).repo("other/liked-GGUF")
    assert ok.options[0].fit == "fits-ram"
    # private: invisible without the token (like the real Hub, 401 RepoNotFound)
    with pytest.raises(RepoNotFound, match="token"):
        await client(repos).repo("other/secret-GGUF")
    secret = await client(repos, token=lambda: TOKEN).repo("other/secret-GGUF")
    assert secret.private and secret.options[0].fit == "fits-ram"
    auths = {s.authorization for s in repos.seen if "secret" in s.path}
    assert f"Bearer {TOKEN}" in auths


async def test_unknown_repo_and_unreachable_hub(fake_hub: FakeHub) -> None:
    from app.errors import HubUnavailable

    with pytest.raises(RepoNotFound):
        await client(fake_hub).repo("acme/nothing-here")
    dead = HubClient(endpoint="http://127.0.0.1:9", memory_probe=lambda: BIG_MACHINE)
    with pytest.raises(HubUnavailable):  # (search would retry with huggingface_hub's backoff)
        await dead.repo("acme/tiny-GGUF")


def test_token_store_is_0600_and_out_of_settings(tmp_path: Path) -> None:
    from app.paths import AppPaths
    from app.settings import SettingsStore, TokenStore

    paths = AppPaths.default(tmp_path).ensure()
    tokens = TokenStore(paths.hf_token_file)
    assert tokens.load() is None
    tokens.save("hf_abc123")
    assert tokens.load() == "hf_abc123"
    assert paths.hf_token_file.stat().st_mode & 0o777 == 0o600
    SettingsStore(paths.settings_file).save(SettingsStore(paths.settings_file).load())
    assert "hf_abc123" not in paths.settings_file.read_text()
    assert json.loads(paths.settings_file.read_text())["downloads"]["stall_timeout_s"] == 30.0
    tokens.save(None)
    assert tokens.load() is None and not paths.hf_token_file.exists()
    from app.errors import ConfigError

    with pytest.raises(ConfigError):
        tokens.save("two words")


async def test_the_hubs_answer_never_renames_the_repo(fake_hub: FakeHub, tmp_path: Path) -> None:
    files = {"m-Q4_K_M.gguf": gguf_bytes(tmp_path)}
    fake_hub.add_repo("acme/case-GGUF", files, tags=["gguf"], api_id="../../evil/x")
    fake_hub.add_repo("acme/fixed-GGUF", files, tags=["gguf"], api_id="ACME/Fixed-GGUF")
    assert (await client(fake_hub).repo("acme/case-GGUF", with_fit=False)).id == "acme/case-GGUF"
    fixed = await client(fake_hub).repo("acme/fixed-GGUF", with_fit=False)
    assert fixed.id == "ACME/Fixed-GGUF"  # the Hub's own spelling of the same repo


def test_fake_hub_speaks_what_huggingface_hub_expects(repos: FakeHub) -> None:
    """The fake's HEAD/redirect headers are the real Hub's: huggingface_hub's own metadata call."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    f = repos.repos["acme/tiny-GGUF"].files["tiny-Q4_K_M.gguf"]
    url = hf_hub_url("acme/tiny-GGUF", "tiny-Q4_K_M.gguf", endpoint=repos.endpoint)
    meta = get_hf_file_metadata(url)
    assert meta.size == len(f.data) and meta.etag == f.sha256
    assert meta.commit_hash == repos.repos["acme/tiny-GGUF"].sha
