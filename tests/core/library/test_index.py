"""ModelLibrary and fsutil: real files under tmp_path, several instances and processes sharing
one index (SECURITY.md items 16 and 23)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import app.core.library.index as library_module
from app.core.library.index import ID_RE, ModelLibrary, id_from_name
from app.core.util import fsutil
from app.core.util.fsutil import atomic_write_json, file_lock, read_json
from app.errors import InvalidModel, ModelNotFound
from tests.support.gguf_files import write_model

REPO = Path(__file__).resolve().parents[3]

MakeGGUF = Callable[..., Path]


def _stray_files(folder: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


# -- ids -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "llama-3.2-1b-instruct-q4_k_m"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct.q4_1"),
        ("model-00001-of-00003.gguf", "model"),  # shards share one id
        ("My Model (final) v2.GGUF", "my-model-final-v2"),
        ("../../etc/passwd.gguf", "etc-passwd"),
        ("C:\\Users\\x\\evil.gguf", "c-users-x-evil"),
        ("\\\\server\\share\\m.gguf", "server-share-m"),
        ("nul\x00byte.gguf", "nul-byte"),
        ("ünïcode-模型.gguf", "n-code"),
        ("....gguf", "model"),
        (".gguf", "model"),
        ("-._x_.-", "x"),
    ],
)
def test_id_from_name(name: str, expected: str) -> None:
    mid = id_from_name(name)
    assert ID_RE.match(mid), mid
    assert "/" not in mid and ".." not in mid.split("-")
    assert mid == expected


def test_id_from_name_is_always_a_valid_id() -> None:
    import random

    rng = random.Random(7)
    alphabet = "aZ09._-/\\: \x00~ü模.."
    for _ in range(2000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) + rng.choice(
            ["", ".gguf"]
        )
        mid = id_from_name(name)
        assert ID_RE.match(mid), (name, mid)
        assert mid == mid.lower()
        assert "/" not in mid  # a file name never turns into a path-like id


# -- import ----------------------------------------------------------------------------------------


def test_import_in_place(library: ModelLibrary, make_gguf: MakeGGUF, models_dir: Path) -> None:
    src = make_gguf("elsewhere/Tiny-Model-Q8_0.gguf")
    model, created = library.import_path(src)
    assert created is True
    assert model.id == "tiny-model-q8_0"
    assert ID_RE.match(model.id)
    assert model.owned is False
    assert model.origin == "imported"
    assert Path(model.path) == src.resolve()
    assert src.is_file()
    assert not models_dir.exists() or not any(models_dir.iterdir())  # nothing copied
    # metadata from the header
    assert model.format == "gguf"
    assert model.architecture == "llama"
    assert model.context_length == 2048
    assert model.quantization == "Q8_0"
    assert model.parameters == 160
    assert model.has_chat_template is True
    assert model.size_bytes == src.stat().st_size
    assert model.name == "Tiny Test"
    assert library.get(model.id) == model
    assert [m.id for m in library.list()] == [model.id]


def test_import_copy(library: ModelLibrary, make_gguf: MakeGGUF, models_dir: Path) -> None:
    src = make_gguf("downloads/Copied.gguf")
    model, created = library.import_path(src, copy=True)
    assert created is True
    assert model.owned is True
    dest = Path(model.path)
    assert dest.parent == models_dir.resolve()
    assert dest.name == "Copied.gguf"
    assert dest.read_bytes() == src.read_bytes()
    assert src.is_file()  # the original stays
    assert _stray_files(models_dir, {"Copied.gguf"}) == []  # no .partial left behind
    assert model.id == "copied"


def test_import_again_is_a_no_op(
    library: ModelLibrary, make_gguf: MakeGGUF, tmp_path: Path
) -> None:
    src = make_gguf("a/m.gguf")
    first, created1 = library.import_path(src)
    second, created2 = library.import_path(src)
    # the same file through another spelling of its path
    third, created3 = library.import_path(tmp_path / "a" / ".." / "a" / "m.gguf")
    assert (created1, created2, created3) == (True, False, False)
    assert first.id == second.id == third.id
    assert len(library.list()) == 1


def test_import_through_a_symlink_records_the_real_path(
    library: ModelLibrary, make_gguf: MakeGGUF, tmp_path: Path
) -> None:
    src = make_gguf("real/m.gguf")
    link = tmp_path / "link.gguf"
    link.symlink_to(src)
    model, _ = library.import_path(link)
    assert model.path == str(src.resolve())
    assert library.import_path(src)[1] is False


def test_name_clash_gets_a_suffix(library: ModelLibrary, make_gguf: MakeGGUF) -> None:
    a, _ = library.import_path(make_gguf("one/model.gguf"))
    b, _ = library.import_path(make_gguf("two/model.gguf"))
    c, _ = library.import_path(make_gguf("three/MODEL.gguf"))
    assert (a.id, b.id, c.id) == ("model", "model-2", "model-3")
    assert {m.path for m in library.list()} == {a.path, b.path, c.path}


def test_copy_of_a_name_already_in_the_models_folder(
    library: ModelLibrary, make_gguf: MakeGGUF, models_dir: Path
) -> None:
    a, _ = library.import_path(make_gguf("one/model.gguf"), copy=True)
    b, _ = library.import_path(make_gguf("two/model.gguf"), copy=True)
    assert a.path != b.path
    assert Path(a.path).is_file() and Path(b.path).is_file()
    assert a.id != b.id
    assert all(Path(m.path).parent == models_dir.resolve() for m in (a, b))


def test_three_copies_of_one_name_in_the_same_second(
    library: ModelLibrary, make_gguf: MakeGGUF, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)  # the same second, deterministically
    results = [
        library.import_path(make_gguf(f"d{i}/model.gguf", name=f"n{i}"), copy=True)
        for i in range(3)
    ]
    assert all(created for _, created in results)
    paths = [m.path for m, _ in results]
    assert len(set(paths)) == 3, paths
    assert [m.name for m, _ in results] == ["n0", "n1", "n2"]
    assert len(library.list()) == 3


def test_invalid_gguf_is_refused_and_not_indexed(
    library: ModelLibrary, tmp_path: Path, index_file: Path, models_dir: Path
) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 100)
    with pytest.raises(InvalidModel):
        library.import_path(bad)
    with pytest.raises(InvalidModel):
        library.import_path(bad, copy=True)
    assert library.list() == []
    assert not models_dir.exists() or list(models_dir.iterdir()) == []  # no copy, no partial
    assert not index_file.exists() or read_json(index_file, {})["models"] == []


def test_non_gguf_file_is_refused(
    library: ModelLibrary, make_gguf: MakeGGUF, tmp_path: Path
) -> None:
    good = make_gguf("m.gguf")
    other = tmp_path / "model.bin"
    other.write_bytes(good.read_bytes())  # valid GGUF bytes, wrong kind of file
    with pytest.raises(InvalidModel):
        library.import_path(other)
    with pytest.raises(InvalidModel):
        library.import_path(tmp_path / "missing.gguf")
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(InvalidModel):
        library.import_path(folder)
    assert library.list() == []


def test_special_files_are_refused_without_hanging(library: ModelLibrary, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)  # opening it for reading would block forever
    with pytest.raises(InvalidModel):
        library.import_path(fifo)


def test_mlx_folder_import(library: ModelLibrary, tmp_path: Path) -> None:
    folder = tmp_path / "Qwen-MLX-4bit"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "max_position_embeddings": 32768,
                "quantization": {"bits": 4},
            }
        )
    )
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    model, created = library.import_path(folder)
    assert created and model.format == "mlx" and not model.owned
    assert (model.id, model.architecture, model.context_length, model.quantization) == (
        "qwen-mlx-4bit",
        "qwen2",
        32768,
        "4bit",
    )
    assert model.chat_template == "{{ x }}"


# -- remove ----------------------------------------------------------------------------------------


def test_remove_in_place_import_keeps_the_file(library: ModelLibrary, make_gguf: MakeGGUF) -> None:
    src = make_gguf("keep/m.gguf")
    model, _ = library.import_path(src)
    removed, deleted = library.remove(model.id)
    assert removed.id == model.id
    assert deleted is False
    assert src.is_file()
    assert library.list() == []
    with pytest.raises(ModelNotFound):
        library.get(model.id)


def test_remove_owned_copy_deletes_it(
    library: ModelLibrary, make_gguf: MakeGGUF, models_dir: Path
) -> None:
    src = make_gguf("orig/m.gguf")
    model, _ = library.import_path(src, copy=True)
    _, deleted = library.remove(model.id)
    assert deleted is True
    assert not Path(model.path).exists()
    assert src.is_file()
    assert list(models_dir.iterdir()) == []
    assert library.list() == []  # not re-adopted


def test_remove_unknown_id(library: ModelLibrary, make_gguf: MakeGGUF) -> None:
    library.import_path(make_gguf())
    for bad in ["nope", "", "../tiny-model", "/etc/passwd", "TINY-MODEL"]:
        with pytest.raises(ModelNotFound):
            library.remove(bad)
        with pytest.raises(ModelNotFound):
            library.get(bad)
    assert len(library.list()) == 1


def test_owned_entry_outside_the_models_folder_is_never_deleted(
    library: ModelLibrary, make_gguf: MakeGGUF, index_file: Path
) -> None:
    # An index edited by hand (or by an older version) must not make Hearth delete a user's file.
    src = make_gguf("users-own/m.gguf")
    model, _ = library.import_path(src)
    data = read_json(index_file, None)
    data["models"][0]["owned"] = True
    atomic_write_json(index_file, data)
    _, deleted = library.remove(model.id)
    assert deleted is False
    assert src.is_file()


# -- the models folder -----------------------------------------------------------------------------


def test_gguf_dropped_into_models_folder_is_adopted(
    library: ModelLibrary, models_dir: Path
) -> None:
    write_model(models_dir / "Dropped-Q8_0.gguf")
    models = library.list()
    assert [(m.id, m.owned, m.origin) for m in models] == [("dropped-q8_0", True, "downloaded")]
    assert library.get("dropped-q8_0").path == str((models_dir / "Dropped-Q8_0.gguf").resolve())
    # adopting is idempotent
    assert len(library.list()) == 1
    _, deleted = library.remove("dropped-q8_0")
    assert deleted is True
    assert not (models_dir / "Dropped-Q8_0.gguf").exists()


def test_get_adopts_a_dropped_file(library: ModelLibrary, models_dir: Path) -> None:
    write_model(models_dir / "late.gguf")
    assert library.get("late").owned is True


def test_models_folder_skips_junk_partials_and_symlinks(
    library: ModelLibrary, models_dir: Path, make_gguf: MakeGGUF
) -> None:
    write_model(models_dir / "good.gguf")
    (models_dir / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    (models_dir / "notes.txt").write_text("hello")
    write_model(models_dir / ".incoming.gguf.partial")
    write_model(models_dir / ".hidden.gguf")
    outside = make_gguf("outside/linked.gguf")
    (models_dir / "linked.gguf").symlink_to(outside)
    os.mkfifo(models_dir / "fifo.gguf")
    assert [m.id for m in library.list()] == ["good"]
    # the symlink target was never adopted as owned, so removing can never delete it
    assert outside.is_file()


def test_corrupt_index_does_not_crash(
    library: ModelLibrary, index_file: Path, make_gguf: MakeGGUF
) -> None:
    index_file.parent.mkdir(parents=True)
    index_file.write_bytes(b"\x00\xff{not json at all\x89PNG")
    assert library.list() == []
    with pytest.raises(ModelNotFound):
        library.get("anything")
    # the bad file is kept for the user, and the library keeps working
    assert index_file.with_suffix(".corrupt").read_bytes() == b"\x00\xff{not json at all\x89PNG"
    model, created = library.import_path(make_gguf())
    assert created and [m.id for m in library.list()] == [model.id]


@pytest.mark.parametrize(
    "content",
    [
        "[]",
        "null",
        '"models"',
        '{"models": "abc"}',
        '{"models": [1, "x", null, {"id": "no-path"}]}',
        '{"version": 99}',
    ],
)
def test_index_of_the_wrong_shape_does_not_crash(
    library: ModelLibrary, index_file: Path, content: str
) -> None:
    index_file.parent.mkdir(parents=True)
    index_file.write_text(content)
    assert library.list() == []


@pytest.mark.parametrize(
    "content",
    [
        '{"models": null}',
        '{"models": [{"id": 5, "path": "/x"}, {"id": "a", "path": "/y"}]}',
        '{"models": [{"id": "a", "path": "/y", "size_bytes": "big"}]}',
    ],
)
def test_index_with_bad_entries_does_not_crash(
    library: ModelLibrary, index_file: Path, content: str
) -> None:
    index_file.parent.mkdir(parents=True)
    index_file.write_text(content)
    library.list()


# -- several instances and processes -----------------------------------------------------------------


def test_two_instances_see_each_others_changes(
    index_file: Path, models_dir: Path, make_gguf: MakeGGUF
) -> None:
    gui = ModelLibrary(index_file, models_dir)
    cli = ModelLibrary(index_file, models_dir)
    m, _ = gui.import_path(make_gguf("a/first.gguf"))
    assert cli.get(m.id) == m
    n, _ = cli.import_path(make_gguf("b/second.gguf"))
    assert [x.id for x in gui.list()] == ["first", "second"]
    # a name clash is resolved against what the other instance wrote
    o, _ = gui.import_path(make_gguf("c/second.gguf"))
    assert o.id == "second-2"
    cli.remove(m.id)
    with pytest.raises(ModelNotFound):
        gui.get(m.id)
    assert {x.id for x in gui.list()} == {n.id, o.id}


def test_concurrent_imports_from_threads(
    index_file: Path, models_dir: Path, make_gguf: MakeGGUF
) -> None:
    files = [make_gguf(f"t{i}/model.gguf") for i in range(24)]  # all the same name: ids must differ
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(chunk: list[Path]) -> None:
        lib = ModelLibrary(index_file, models_dir)
        barrier.wait()
        try:
            for f in chunk:
                lib.import_path(f)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(files[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    models = ModelLibrary(index_file, models_dir).list()
    assert {m.path for m in models} == {str(f.resolve()) for f in files}
    ids = [m.id for m in models]
    assert len(set(ids)) == 24
    assert set(ids) == {"model"} | {f"model-{i}" for i in range(2, 25)}


_IMPORTER = """
import sys, time
from pathlib import Path
from app.core.library.index import ModelLibrary
index, models, start = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
lib = ModelLibrary(index, models)
while time.time() < start:
    time.sleep(0.001)
for f in sys.argv[4:]:
    lib.import_path(f)
"""


def test_concurrent_imports_from_processes(
    index_file: Path, models_dir: Path, make_gguf: MakeGGUF
) -> None:
    files = [make_gguf(f"p{i}/model.gguf") for i in range(20)]
    start = time.time() + 1.5  # every process starts importing at the same moment
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _IMPORTER,
                str(index_file),
                str(models_dir),
                str(start),
                *map(str, files[i::4]),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
        )
        for i in range(4)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    models = ModelLibrary(index_file, models_dir).list()
    assert {m.path for m in models} == {str(f.resolve()) for f in files}
    assert len({m.id for m in models}) == 20
    assert _stray_files(index_file.parent, {"library.json", "library.json.lock"}) == []


# -- an in-memory index, no folder scan per query ----------------------------------------


class _Count:
    """Wraps a module function of app.core.library.index; counts the calls on ``first``."""

    def __init__(self, name: str, first: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real, self.first, self.calls = getattr(library_module, name), first, 0
        monkeypatch.setattr(library_module, name, self)

    def __call__(self, first: Path, *args: Any, **kwargs: Any) -> Any:
        if Path(first) == self.first:
            self.calls += 1
        return self.real(first, *args, **kwargs)


def _import_in_another_process(index_file: Path, models_dir: Path, path: Path) -> None:
    code = (
        "import sys\nfrom pathlib import Path\nfrom app.core.library.index import ModelLibrary\n"
        "ModelLibrary(Path(sys.argv[1]), Path(sys.argv[2])).import_path(sys.argv[3])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(index_file), str(models_dir), str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30  # generous: what is checked is that it happens
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_queries_answer_from_memory(
    library: ModelLibrary,
    make_gguf: MakeGGUF,
    index_file: Path,
    models_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_model(models_dir / "in-folder.gguf")
    m, _ = library.import_path(make_gguf())
    assert {x.id for x in library.list()} == {m.id, "in-folder"}
    reads = _Count("read_json", index_file, monkeypatch)
    scans = _Count("_candidates", models_dir, monkeypatch)
    start = time.monotonic()
    for _ in range(200):
        assert len(library.list()) == 2
        assert library.get(m.id) == m
    elapsed = time.monotonic() - start
    assert reads.calls == 0, f"the index was read {reads.calls} times in 200 queries"
    assert scans.calls <= 2 + elapsed / library_module.ADOPT_INTERVAL_S, (scans.calls, elapsed)


def test_a_model_imported_by_another_process_is_seen(
    library: ModelLibrary, make_gguf: MakeGGUF, index_file: Path, models_dir: Path
) -> None:
    assert library.list() == []
    other = make_gguf("other/From-Elsewhere.gguf")
    _import_in_another_process(index_file, models_dir, other)
    assert library.get("from-elsewhere").path == str(other.resolve())  # a miss looks at once
    assert library.find_by_path(other) is not None
    _until(lambda: [x.id for x in library.list()] == ["from-elsewhere"], "never listed")
    # and what this process writes next is written over the other's entry, not over a stale copy
    mine, _ = library.import_path(make_gguf("mine/from-elsewhere.gguf"))
    assert mine.id == "from-elsewhere-2"
    assert {x.id for x in ModelLibrary(index_file, models_dir).list()} == {
        "from-elsewhere",
        "from-elsewhere-2",
    }


def test_a_file_dropped_in_later_is_listed_by_a_background_scan(
    library: ModelLibrary, models_dir: Path
) -> None:
    assert library.list() == []  # the first scan ran (and found nothing)
    write_model(models_dir / "owner" / "name" / "Late-Q8_0.gguf")
    _until(lambda: [x.id for x in library.list()] == ["late-q8_0"], "the dropped file never showed")
    assert library.get("late-q8_0").owned is True


# -- fsutil ----------------------------------------------------------------------------------------


def test_atomic_write_json_leaves_a_complete_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state" / "library.json"
    for i in range(20):
        payload = {"version": 1, "models": [{"id": f"m{j}", "path": "/x" * 100} for j in range(i)]}
        atomic_write_json(target, payload)
        assert json.loads(target.read_text()) == payload
    assert _stray_files(target.parent, {"library.json"}) == []
    assert read_json(tmp_path / "missing.json", {"d": 1}) == {"d": 1}


def test_atomic_write_mode(tmp_path: Path) -> None:
    target = tmp_path / "secret.json"
    atomic_write_json(target, {"a": 1}, mode=0o600)
    assert target.stat().st_mode & 0o777 == 0o600


def test_crash_before_rename_keeps_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "library.json"
    atomic_write_json(target, {"v": 1})

    def crash(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", crash)
    with pytest.raises(OSError):
        atomic_write_json(target, {"v": 2, "big": "x" * 100_000})
    monkeypatch.undo()
    assert read_json(target, None) == {"v": 1}
    assert _stray_files(tmp_path, {"library.json"}) == []


def test_crash_during_write_keeps_the_previous_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "library.json"
    atomic_write_json(target, {"v": 1})

    def crash(_fd: int) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(fsutil.os, "fsync", crash)
    with pytest.raises(OSError):
        atomic_write_json(target, {"v": 2})
    monkeypatch.undo()
    assert read_json(target, None) == {"v": 1}
    assert _stray_files(tmp_path, {"library.json"}) == []


def test_library_write_failure_keeps_the_index(
    library: ModelLibrary, index_file: Path, make_gguf: MakeGGUF, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = library.import_path(make_gguf("a/first.gguf"))
    before = index_file.read_bytes()

    def crash(*_a: object, **_k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "replace", crash)
    with pytest.raises(OSError):
        library.import_path(make_gguf("b/second.gguf"))
    monkeypatch.undo()
    assert index_file.read_bytes() == before
    assert [m.id for m in library.list()] == [first.id]
    assert _stray_files(index_file.parent, {"library.json", "library.json.lock"}) == []


_KILLED_WRITER = """
import os, sys, time
from pathlib import Path
from app.core.util import fsutil
from app.core.library.index import ModelLibrary
lib = ModelLibrary(Path(sys.argv[1]), Path(sys.argv[2]))
def hang(*a, **k):
    print("in-rename", flush=True)
    time.sleep(60)
fsutil.os.replace = hang
lib.import_path(sys.argv[3])
"""


def test_kill_during_index_write_keeps_the_previous_version(
    library: ModelLibrary, index_file: Path, models_dir: Path, make_gguf: MakeGGUF
) -> None:
    first, _ = library.import_path(make_gguf("a/first.gguf"))
    second = make_gguf("b/second.gguf")
    p = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(index_file), str(models_dir), str(second)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line == b"in-rename\n", p.stderr.read() if p.stderr else b""
        # the new index is fully written to its temp file, the rename has not happened: kill -9
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert [m.id for m in library.list()] == [first.id]
    # the lock died with the process: the next writer is not blocked
    third, created = library.import_path(second)
    assert created and [m.id for m in library.list()] == [first.id, third.id]


def test_file_lock_serializes(tmp_path: Path) -> None:
    target = tmp_path / "shared.json"
    inside = 0
    most = 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        for _ in range(20):
            with file_lock(target):
                with guard:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.0005)
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most == 1
