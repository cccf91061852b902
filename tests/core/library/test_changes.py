"""IndexChanges: a change to the library index on disk (another process's import, a file adopted
from the models folder) publishes one LibraryChanged; no change publishes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from app.core.events import Event, EventHub, LibraryChanged
from app.core.library.changes import IndexChanges
from app.core.library.index import ModelLibrary
from tests.support.gguf_files import write_model

ROOT = Path(__file__).resolve().parents[3]


def test_another_process_import_publishes_library_changed_once(tmp_path: Path) -> None:
    index, models = tmp_path / "library.json", tmp_path / "models"
    models.mkdir()
    events = EventHub()
    seen: list[Event] = []
    events.subscribe(seen.append)
    changes = IndexChanges(ModelLibrary(index, models), events)
    assert changes.check() is False and seen == []

    gguf = write_model(tmp_path / "tiny.gguf")
    code = (
        "import sys; from pathlib import Path; from app.core.library.index import ModelLibrary; "
        "ModelLibrary(Path(sys.argv[1]), Path(sys.argv[2])).import_path(sys.argv[3])"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(index), str(models), str(gguf)], cwd=ROOT, check=True
    )
    assert changes.check() is True
    assert [type(e) for e in seen] == [LibraryChanged]
    assert changes.check() is False  # seen once
    assert [m["id"] for m in json.loads(index.read_text())["models"]] == ["tiny"]


def test_a_file_dropped_into_the_models_folder_is_adopted_and_published(tmp_path: Path) -> None:
    index, models = tmp_path / "library.json", tmp_path / "models"
    models.mkdir()
    events = EventHub()
    seen: list[Event] = []
    events.subscribe(seen.append)
    library = ModelLibrary(index, models)
    library.list()  # the first scan, as a window's first listing does
    changes = IndexChanges(library, events)
    write_model(models / "dropped.gguf")
    deadline = time.monotonic() + 30
    while not seen and time.monotonic() < deadline:
        changes.check()  # the scan runs on a thread of its own; a later check sees its write
        time.sleep(0.1)
    assert [type(e) for e in seen] == [LibraryChanged]
    assert [m.id for m in library.list()] == ["dropped"]
