"""ModelLibrary: the index of local models (GGUF files, MLX folders) shared by every process."""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
import os
import re
import shutil
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.core.library import stores
from app.core.library.formats import describe
from app.core.library.formats.mlx_folder import is_mlx_folder
from app.core.library.formats.whisper_folder import is_whisper_folder
from app.core.library.gguf import FIRST_SHARD_RE, shard_siblings
from app.core.library.projector import apply_pairing, is_projector_name, pair_in_folder
from app.core.types import LocalModel
from app.core.util import filecache
from app.core.util.filecache import FileCache
from app.core.util.fsutil import (
    atomic_write_json,
    file_lock,
    read_json,
    remove_stale_temp_files,
    remove_stale_writes,
    temp_path,
)
from app.errors import InvalidModel, ModelNotFound

log = logging.getLogger(__name__)

ID_RE = re.compile(r"^[a-z0-9][a-z0-9._:/-]*$")
_SHARD_RE = re.compile(r"-\d{5}-of-\d{5}$")
_ANY_SHARD_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)
INDEX_VERSION = 1
# the models folder is scanned for dropped-in files at most this often, off the caller's thread
# (the first scan of an instance excepted: a one-shot `hearth ls` lists what it finds)
ADOPT_INTERVAL_S = 2.0


def id_from_name(name: str) -> str:
    """A stable lowercase id from a file or folder name: ``[a-z0-9._:/-]+``."""
    stem = name[:-5] if name.lower().endswith(".gguf") else name
    stem = _SHARD_RE.sub("", stem).lower()
    stem = re.sub(r"[^a-z0-9._-]+", "-", stem).strip("-._")
    return stem or "model"


class ModelLibrary:
    """The library index (one JSON file) shared by every process.

    Changes read the file fresh under its file lock. Queries answer from an in-memory copy that
    every instance in this process shares, re-read only when a stat (at most once a second)
    shows another process replaced the file; files dropped into the models folder are indexed
    by a scan that runs at most every ``ADOPT_INTERVAL_S``, on a thread of its own.
    """

    def __init__(self, index_file: Path, models_dir: Path) -> None:
        self.index_file = index_file
        self.models_dir = models_dir
        self._clean_stale_temp_files()
        self._index: FileCache[builtins.list[dict[str, Any]]] = filecache.shared(
            index_file, "library"
        )
        self._scan_lock = threading.Lock()
        self._scanning = False
        self._scanned_at = -math.inf

    def _clean_stale_temp_files(self) -> None:
        """Temp files of writes or copies whose process was killed (kill -9) mid-way."""
        remove_stale_writes(self.index_file)
        remove_stale_temp_files(self.models_dir, ".*.partial")

    # -- index file -------------------------------------------------------------------------
    def _read(self) -> list[dict[str, Any]]:
        try:
            data = read_json(self.index_file, {"version": INDEX_VERSION, "models": []})
        except ValueError:
            log.error(
                "library index %s is corrupt; starting empty (file kept as .corrupt)",
                self.index_file,
            )
            with contextlib.suppress(OSError):
                shutil.copy2(self.index_file, self.index_file.with_suffix(".corrupt"))
            return []
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, list):
            return []
        good = []
        for m in models:
            if not (
                isinstance(m, dict)
                and isinstance(m.get("id"), str)
                and isinstance(m.get("path"), str)
            ):
                log.warning("library index: skipping a malformed entry")
                continue
            try:
                self._to_model(m)
            except (TypeError, ValueError) as e:
                log.warning("library index: skipping entry %r: %s", m.get("id"), e)
                continue
            good.append(m)
        return good

    def _write(self, entries: list[dict[str, Any]]) -> None:
        """Replace the index; called under its file lock, so no other write comes in between."""
        atomic_write_json(self.index_file, {"version": INDEX_VERSION, "models": entries})
        self._index.put(builtins.list(entries))

    def _entries(self, *, fresh: bool = False) -> builtins.list[dict[str, Any]]:
        """The index as last read or written (do not modify it)."""
        return self._index.get(self._read, fresh=fresh)

    @staticmethod
    def _to_model(d: dict[str, Any]) -> LocalModel:
        template = d.get("chat_template")
        return LocalModel(
            id=d["id"],
            path=d["path"],
            format=d.get("format", "gguf"),
            size_bytes=int(d.get("size_bytes") or 0),
            owned=bool(d.get("owned")),
            architecture=d.get("architecture"),
            name=d.get("name"),
            parameters=d.get("parameters"),
            quantization=d.get("quantization"),
            context_length=d.get("context_length"),
            has_chat_template=bool(template),
            chat_template=template,
            origin=d.get("origin", "imported"),
            added_at=float(d.get("added_at") or 0.0),
            mtime=float(d.get("mtime") or 0.0),
            extra=dict(d.get("extra") or {}),
        )

    @staticmethod
    def _to_entry(m: LocalModel) -> dict[str, Any]:
        d = asdict(m)
        d.pop("has_chat_template", None)
        return d

    # -- queries ----------------------------------------------------------------------------
    def list(self) -> list[LocalModel]:
        """Every model in the index, sorted by id. Files dropped into the models folder join it
        once a scan has seen them (this call starts one when the last is over 2 s old)."""
        self._scan_models_folder()
        return sorted((self._to_model(d) for d in self._entries()), key=lambda m: m.id)

    def get(self, model_id: str) -> LocalModel:
        """Raises ModelNotFound."""
        d = self._find(model_id)
        if d is None:
            raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
        return self._to_model(d)

    def has(self, model_id: str) -> bool:
        """Whether ``model_id`` is in the index (looked up as :meth:`get` does)."""
        # asked of every remote id on every request: a miss must not cost an exception
        return self._find(model_id) is not None

    def _find(self, model_id: str) -> dict[str, Any] | None:
        for d in self._entries():
            if d["id"] == model_id:
                return d
        # a miss checks the file now (another process may have just added it); a file dropped
        # into the models folder is found by the scan this starts (at once on the first one)
        self._scan_models_folder()
        for d in self._entries(fresh=True):
            if d["id"] == model_id:
                return d
        return None

    def poll(self) -> filecache.Signature:
        """The index file's signature now, with this process's copy brought up to date; also
        starts a scan of the models folder when the last is over ``ADOPT_INTERVAL_S`` old (a
        file it adopts rewrites the index, so a later poll sees it)."""
        self._scan_models_folder()
        sig = filecache.signature(self.index_file)
        self._entries(fresh=True)  # a change seen here must be what the next list() answers
        return sig

    def find_by_path(self, path: Path) -> LocalModel | None:
        real = str(path.resolve())
        for d in self._entries(fresh=True):
            if d["path"] == real:
                return self._to_model(d)
        return None

    # -- changes ----------------------------------------------------------------------------
    def import_path(
        self, path: str | os.PathLike[str], *, copy: bool = False
    ) -> tuple[LocalModel, bool]:
        """Add a GGUF file or MLX folder. Returns (model, created); importing again is a no-op.

        Raises:
            InvalidModel: not a model, or its header fails validation.
        """
        src = Path(path).expanduser()
        if not src.exists():
            raise InvalidModel(f"{src} does not exist")
        src = src.resolve()
        meta = describe(src)  # validate before touching anything
        existing = self.find_by_path(src)
        if existing and not copy:
            return existing, False
        owned = False
        extra = dict(meta.get("extra") or {})
        if copy:
            # copying the same source again gives the existing copy
            for d in self._entries(fresh=True):
                if (d.get("extra") or {}).get("source") == str(src) and Path(d["path"]).exists():
                    return self._to_model(d), False
            self.models_dir.mkdir(parents=True, exist_ok=True)
            dest = self._free_name(src)
            tmp = temp_path(dest, ".partial")
            try:
                if src.is_dir():
                    shutil.copytree(src, tmp)
                else:
                    shutil.copyfile(src, tmp)
                os.replace(tmp, dest)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
            extra["source"] = str(src)
            src, owned = dest.resolve(), True
        meta = {**meta, "extra": extra}
        # a projector lying next to the source pairs with it (a --copy keeps pointing there)
        meta = paired(Path(extra.get("source") or src), meta)
        return self._add(src, meta, owned=owned, origin="imported"), True

    def _free_name(self, src: Path) -> Path:
        """A name in the models folder that nothing uses yet (reserved with O_EXCL)."""
        stem, suffix = (src.stem, src.suffix) if src.is_file() else (src.name, "")
        n = 1
        while True:
            dest = self.models_dir / (f"{stem}{suffix}" if n == 1 else f"{stem}-{n}{suffix}")
            try:
                if src.is_dir():
                    dest.mkdir()
                    dest.rmdir()  # the name is ours: copytree then os.replace into it
                    if not dest.exists():
                        return dest
                else:
                    fd = os.open(dest, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                    os.close(fd)
                    return dest
            except FileExistsError:
                pass
            n += 1

    def _add(
        self,
        path: Path,
        meta: dict[str, Any],
        *,
        owned: bool,
        origin: str,
        id_hint: str | None = None,
        refresh: bool = False,
    ) -> LocalModel:
        key = _store_key(str(path), meta.get("extra") or {})
        with file_lock(self.index_file):
            entries = self._read()
            for i, d in enumerate(entries):
                if _store_key(d["path"], d.get("extra") or {}) == key:
                    if not refresh:
                        return self._to_model(d)
                    # the same path, new bytes (a re-download): keep the id, renew the metadata
                    del entries[i]
                    base = d["id"]
                    break
            else:
                base = id_hint or id_from_name(path.name)
            taken = {d["id"] for d in entries}
            mid, n = base, 2
            while mid in taken:
                mid, n = f"{base}-{n}", n + 1
            model = LocalModel(
                id=mid,
                path=str(path),
                format=meta["format"],
                size_bytes=meta["size_bytes"],
                owned=owned,
                architecture=meta.get("architecture"),
                name=meta.get("name"),
                parameters=meta.get("parameters"),
                quantization=meta.get("quantization"),
                context_length=meta.get("context_length"),
                has_chat_template=bool(meta.get("chat_template")),
                chat_template=meta.get("chat_template"),
                origin=origin,
                added_at=time.time(),
                mtime=path.stat().st_mtime,
                extra=meta.get("extra") or {},
            )
            entries.append(self._to_entry(model))
            self._write(entries)
        log.info("library: added %s (%s)", model.id, path)
        return model

    def remove(self, model_id: str, *, delete_file: bool = False) -> tuple[LocalModel, bool]:
        """Forget a model. Returns (model, deleted).

        Hearth's own files (downloads, ``--copy`` imports) are deleted. Files of another app (the
        Hugging Face cache, LM Studio, Ollama) are deleted only with ``delete_file=True`` (the
        user confirmed); otherwise they stay and a rescan does not list them again. Files
        imported in place are never deleted.
        """
        with file_lock(self.index_file):
            entries = self._read()
            for i, d in enumerate(entries):
                if d["id"] == model_id:
                    model = self._to_model(d)
                    del entries[i]
                    self._write(entries)
                    break
            else:
                raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
        deleted = False
        if model.owned:
            p = Path(model.path)
            # only ever delete inside our own models folder
            root = self.models_dir.resolve()
            if p.resolve().is_relative_to(root):
                for q in shard_siblings(p):
                    with contextlib.suppress(FileNotFoundError):
                        shutil.rmtree(q) if q.is_dir() and not q.is_symlink() else q.unlink()
                deleted = True
                _prune_empty_parents(p.parent, root)
        elif model.origin in stores.FOREIGN_ORIGINS:
            if delete_file:
                deleted = stores.delete_found(model.path, model.origin, model.extra)
            else:
                self._hide(_store_key(model.path, model.extra))
        log.info("library: removed %s (file deleted: %s)", model_id, deleted)
        return model, deleted

    # -- other apps' stores -------------------------------------------------------------------
    @property
    def _hidden_file(self) -> Path:
        return self.index_file.with_name("library-hidden.json")

    def _hidden(self) -> set[str]:
        try:
            data = read_json(self._hidden_file, [])
        except ValueError:
            return set()
        return {x for x in data if isinstance(x, str)} if isinstance(data, list) else set()

    def _hide(self, path: str) -> None:
        with file_lock(self._hidden_file):
            hidden = self._hidden()
            hidden.add(path)
            atomic_write_json(self._hidden_file, sorted(hidden))

    def index_foreign(self, locations: stores.ForeignLocations) -> builtins.list[LocalModel]:
        """Index, in place, the models other apps downloaded (see ``app.core.library.stores``); drop
        entries whose files those apps deleted. Returns the models added now."""
        found = stores.scan(locations)
        hidden = self._hidden()
        present = {_store_key(str(f.path), f.extra) for f in found}
        with file_lock(self.index_file):
            entries = self._read()
            keep = [
                d
                for d in entries
                if d.get("origin") not in stores.FOREIGN_ORIGINS
                or _store_key(d["path"], d.get("extra") or {}) in present
                or _still_there(d)
            ]
            if len(keep) != len(entries):
                self._write(keep)
            known = {_store_key(d["path"], d.get("extra") or {}) for d in keep}
        added = []
        for f in found:
            key = _store_key(str(f.path), f.extra)
            if key in known or key in hidden:
                continue
            try:
                meta = describe(f.path, format=f.format)
            except InvalidModel as e:
                log.warning("%s: skipping %s: %s", f.origin, f.path, e)
                continue
            meta = {**meta, "extra": {**(meta.get("extra") or {}), **f.extra}}
            if f.origin != stores.ORIGIN_OLLAMA:  # Ollama's blobs have no names to pair by
                meta = paired(f.path, meta)
            added.append(
                self._add(f.path, meta, owned=False, origin=f.origin, id_hint=_foreign_id(f))
            )
        return added

    def add_downloaded(
        self, path: Path, *, source: dict[str, Any], projector: Path | None = None
    ) -> LocalModel:
        """Register a verified download in the models folder (Hearth owns it).

        ``projector``: the vision projector downloaded with it; paired when it matches the
        model, else the entry's ``extra.projector_refused`` says why (no projector: one lying
        next to the model is paired, as a scan would).

        Raises:
            InvalidModel: the file or folder fails validation.
        """
        real = path.resolve()
        meta = describe(real)
        meta = {**meta, "extra": {**(meta.get("extra") or {}), "hub": source}}
        meta = paired(real, meta, None if projector is None else [projector])
        return self._add(real, meta, owned=True, origin="downloaded", refresh=True)

    def _scan_models_folder(self) -> None:
        """Index what appeared in the models folder unless a scan ran within ADOPT_INTERVAL_S:
        the first time in this thread (a one-shot command lists what is there), later on a
        thread of its own (a request never waits for a folder scan)."""
        with self._scan_lock:
            if self._scanning or time.monotonic() - self._scanned_at < ADOPT_INTERVAL_S:
                return
            first = self._scanned_at == -math.inf
            self._scanning = True
        if first:
            self._run_scan()
        else:
            threading.Thread(target=self._run_scan, name="library-scan", daemon=True).start()

    def _run_scan(self) -> None:
        try:
            self._adopt_models_folder()
        except Exception:  # a thread's error would vanish: say what happened
            log.exception("models folder %s: the scan failed", self.models_dir)
        finally:
            with self._scan_lock:
                self._scanning = False
                self._scanned_at = time.monotonic()

    def _adopt_models_folder(self) -> None:
        """Index valid GGUF files and MLX folders that appeared in the models folder (pulls,
        manual copies): at the top level and in ``OWNER/NAME/`` folders. Dot-files (partial
        downloads), symlinks and later shards of split GGUFs are never adopted."""
        if not self.models_dir.is_dir():
            return
        known = {d["path"] for d in self._entries(fresh=True)}
        for p in _candidates(self.models_dir):
            rp = str(p.resolve())
            if rp in known:
                continue
            try:
                meta = paired(Path(rp), describe(Path(rp)))
                self._add(Path(rp), meta, owned=True, origin="downloaded")
            except InvalidModel as e:
                log.warning("models folder: skipping %s: %s", p.name, e)
            except OSError as e:  # e.g. a full disk: listing what is indexed must still work
                log.warning("models folder: cannot index %s now: %s", p.name, e)


def _plain(p: Path) -> bool:
    return not p.name.startswith(".") and not p.is_symlink()


def _candidates(root: Path, depth: int = 2) -> list[Path]:
    """Model files, MLX and Whisper folders under ``root`` (down to ``depth`` folder levels)."""
    out: list[Path] = []
    try:
        children = sorted(root.iterdir())
    except OSError:
        return out
    for p in children:
        if not _plain(p):
            continue
        if p.is_file() and p.suffix.lower() == ".gguf":
            if is_projector_name(p.name):
                continue  # a vision projector: paired with its model, never a model
            if not _ANY_SHARD_RE.search(p.name) or FIRST_SHARD_RE.match(p.name):
                out.append(p)
        elif is_mlx_folder(p) or is_whisper_folder(p):
            out.append(p)
        elif p.is_dir() and depth > 0:
            out.extend(_candidates(p, depth - 1))
    return out


def paired(
    path: Path, meta: dict[str, Any], candidates: builtins.list[Path] | None = None
) -> dict[str, Any]:
    """``meta`` of a GGUF model with the projector that matches it: among ``candidates``, or the
    ``mmproj*.gguf`` files next to it (see ``app.core.library.projector``)."""
    if meta.get("format") != "gguf":
        return meta
    pairing = pair_in_folder(path, candidates)
    extra = apply_pairing(dict(meta.get("extra") or {}), pairing, model=path.name)
    return {**meta, "extra": extra}


def _prune_empty_parents(folder: Path, root: Path) -> None:
    """Remove the OWNER/NAME folders a deletion left empty (never ``root`` itself)."""
    p = folder
    while p.resolve() != root and p.resolve().is_relative_to(root):
        try:
            p.rmdir()
        except OSError:
            return
        p = p.parent


def _still_there(d: dict[str, Any]) -> bool:
    """A foreign entry whose files the other app has not deleted (its store may be unscanned)."""
    manifest = (d.get("extra") or {}).get("manifest")
    if isinstance(manifest, str) and manifest and not Path(manifest).is_file():
        return False
    return Path(d["path"]).exists()


def _store_key(path: str, extra: dict[str, Any]) -> str:
    """What makes an entry unique: its path, or for an Ollama tag its manifest (tags share blobs)."""
    manifest = extra.get("manifest")
    return f"manifest:{manifest}" if isinstance(manifest, str) and manifest else path


def _foreign_id(f: stores.FoundModel) -> str:
    if f.origin == stores.ORIGIN_OLLAMA:
        mid = re.sub(r"[^a-z0-9._:/-]+", "-", f.name.lower()).strip("-._:/")
        mid = "/".join(part for part in mid.split("/") if part not in ("", ".", ".."))
        return mid if mid and ID_RE.match(mid) else id_from_name(f.name)
    return id_from_name(f.name)
