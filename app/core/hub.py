"""HubClient: search the Hugging Face Hub and look inside a repo before downloading anything.

huggingface_hub does the talking (``HfApi`` for search and repo metadata, ``hf_hub_url`` and
``build_hf_headers`` for file URLs and auth); Hearth adds what it needs on top and trusts
nothing the repo says: names are checked before they can become paths, quantizations are read
from the GGUF header itself (fetched with an HTTP Range request), and repos that could run code
(pickle weights, ``auto_map``/``trust_remote_code``, ``model_file``) are refused with a reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import httpx2
from huggingface_hub import HfApi, constants, get_async_session, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers

from app.core import fit as fitlib
from app.core import gguf
from app.errors import (
    AccessDenied,
    AmbiguousChoice,
    HearthError,
    HubUnavailable,
    InvalidModel,
    RepoNotFound,
    RepoRefused,
)

log = logging.getLogger(__name__)

Sort = Literal["downloads", "likes", "recent", "created"]
HubFormat = Literal["gguf", "mlx"]
SORT_PARAMS: dict[str, str] = {
    "downloads": "downloads",
    "likes": "likes",
    "recent": "last_modified",
    "created": "created_at",
}
SEARCH_EXPAND = [
    "author",
    "downloads",
    "likes",
    "lastModified",
    "createdAt",
    "gated",
    "private",
    "tags",
    "library_name",
    "pipeline_tag",
]
SIZE_CONCURRENCY = 4  # repo lookups at once when filling in search results' sizes
HEADER_FIRST_READ = 2 * 1024 * 1024
HEADER_MAX_READ = 64 * 1024 * 1024  # vocabularies of 256k tokens need ~10 MB; beyond this: refuse
DEFAULT_QUANT = "Q4_K_M"

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# What an MLX folder needs; everything else in the repo (code, pickles, images) stays behind.
MLX_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken")
MLX_SKIP = {"readme.md", "license", "license.txt", "notice.txt"}

_NAME_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID_RE = re.compile(rf"^{_NAME_PART}/{_NAME_PART}$")
QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])("
    r"UD-(?:IQ|Q)\d[A-Z0-9_]*"
    r"|IQ[1-4]_(?:XXS|XS|NL|S|M)"
    r"|Q[2-8]_K(?:_(?:XL|S|M|L))?"
    r"|Q[4-8]_[01]"
    r"|TQ[12]_0|MXFP4|BF16|F16|F32|FP16|FP32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<n>\d{5})\.gguf$", re.IGNORECASE)
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_CTRL_RE = re.compile(r"[\x00-\x1f\x7f]")
HUB_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})


# -- names ------------------------------------------------------------------------------------------
def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` when it is a plain ``owner/name``.

    Raises:
        RepoRefused: anything else (``..``, slashes, drive letters, NUL, ...).
    """
    if not isinstance(repo_id, str) or not REPO_ID_RE.match(repo_id):
        raise RepoRefused(f"'{_shown(repo_id)}' is not a Hugging Face repo id (owner/name)")
    if ".." in repo_id or "--" in repo_id:
        raise RepoRefused(
            f"'{_shown(repo_id)}' is not a valid repo id ('..' and '--' are not allowed)"
        )
    return repo_id


def check_repo_path(path: str) -> str:
    """Return a repo file name when it is safe to turn into a path under the models folder.

    Refused: empty or absolute paths, ``..`` or ``.`` parts, backslashes (Windows separators, UNC
    paths), drive letters, NUL and control characters, hidden (dot) names, over-long names.

    Raises:
        RepoRefused: the name is unsafe.
    """
    why = None
    if not isinstance(path, str) or not path:
        why = "an empty name"
    elif _CTRL_RE.search(path):
        why = "a control character (NUL?)"
    elif "\\" in path:
        why = "a backslash (a Windows or UNC path)"
    elif path.startswith("/"):
        why = "an absolute path"
    elif _DRIVE_RE.match(path) or ":" in path:
        why = "a drive letter or colon"
    elif len(path) > 1024:
        why = "an over-long name"
    else:
        for part in path.split("/"):
            if part in ("", ".", ".."):
                why = "a '.', '..' or empty path component"
                break
            if part.startswith("."):
                why = "a hidden (dot) name"
                break
            if len(part) > 255 or part.endswith((" ", ".")):
                why = "an invalid path component"
                break
    if why:
        raise RepoRefused(f"refusing the repo file '{_shown(path)}': it has {why}")
    return path


def _shown(s: object) -> str:
    return repr(s)[1:-1] if isinstance(s, str) else repr(s)


def quant_of(filename: str) -> str | None:
    """The quantization named in a file name (``Q4_K_M``, ``IQ4_XS``, ``BF16``...), uppercased."""
    base = filename.rsplit("/", 1)[-1]
    m = QUANT_RE.search(base)
    if not m:
        return None
    q = m.group(1).upper()
    return {"FP16": "F16", "FP32": "F32"}.get(q, q)


@dataclass(frozen=True, slots=True)
class HubRef:
    """What a user asked to pull: a repo plus, optionally, a quantization or a file."""

    repo_id: str
    revision: str | None = None
    quant: str | None = None
    filename: str | None = None

    def __str__(self) -> str:
        s = self.repo_id
        if self.filename:
            s += "/" + self.filename
        elif self.quant:
            s += ":" + self.quant
        return s


def parse_ref(text: str, *, endpoint: str | None = None) -> HubRef:
    """Parse ``owner/name``, ``owner/name:QUANT``, ``owner/name/file.gguf``, ``hf.co/owner/name``
    or a Hub URL (``https://huggingface.co/owner/name[/blob|resolve|tree/REV[/file]]``).

    Raises:
        RepoRefused: not a repo reference, or it names an unsafe file.
    """
    raw = (text or "").strip()
    if not raw or _CTRL_RE.search(raw):
        raise RepoRefused(f"'{_shown(raw)}' is not a model reference (expected owner/name)")
    revision: str | None = None
    if "://" in raw:
        parts = urlsplit(raw)
        hosts = set(HUB_HOSTS)
        if endpoint:
            hosts.add((urlsplit(endpoint).netloc or "").lower())
        if parts.scheme not in ("http", "https") or parts.netloc.lower() not in hosts:
            raise RepoRefused(f"'{raw}' is not a Hugging Face URL")
        path = unquote(parts.path).strip("/")
    else:
        path = raw
        for host in HUB_HOSTS:
            if path.lower().startswith(host + "/"):
                path = path[len(host) + 1 :]
                break
    segs = path.split("/")
    if len(segs) < 2:
        raise RepoRefused(f"'{raw}' is not a model reference (expected owner/name)")
    owner, name, rest = segs[0], segs[1], segs[2:]
    quant = None
    if not rest and ":" in name:
        name, _, quant = name.partition(":")
        if not quant or not re.fullmatch(r"[A-Za-z0-9_.-]+", quant):
            raise RepoRefused(f"'{raw}': the quantization after ':' is empty or invalid")
    repo_id = check_repo_id(f"{owner}/{name}")
    filename = None
    if rest and rest[0] in ("blob", "resolve", "tree") and len(rest) >= 2:
        revision = rest[1]
        rest = rest[2:]
    if rest:
        filename = check_repo_path("/".join(rest))
    if revision is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", revision):
        raise RepoRefused(f"'{raw}': unsupported revision '{revision}'")
    return HubRef(repo_id, revision, quant, filename)


# -- repo contents ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RepoFile:
    """One file of a repo as the Hub's API lists it."""

    path: str
    size: int | None
    sha256: str | None  # the LFS oid: what the downloaded bytes must hash to
    blob_id: str | None  # the git blob sha1 (files not in LFS are verified with it)

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


@dataclass(frozen=True, slots=True)
class ModelOption:
    """One thing a repo offers: a GGUF quantization (one file or all shards) or an MLX folder."""

    name: str  # "Q4_K_M", or the file stem when the name carries no quantization; "mlx"
    format: HubFormat
    quantization: str | None
    files: tuple[RepoFile, ...]
    size_bytes: int
    fit: fitlib.Fit | None = None  # None until estimated (or when the header could not be read)
    estimate: fitlib.MemoryEstimate | None = None
    fit_error: str | None = None

    @property
    def first_file(self) -> RepoFile:
        return self.files[0]

    @property
    def sharded(self) -> bool:
        return len(self.files) > 1 and self.format == "gguf"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "quantization": self.quantization,
            "files": [f.path for f in self.files],
            "size_bytes": self.size_bytes,
            "fit": self.fit,
            "memory_bytes": self.estimate.total if self.estimate else None,
            "fit_error": self.fit_error,
        }


@dataclass(frozen=True, slots=True)
class ModelSummary:
    """A search result: what the Discover list shows per repo."""

    id: str
    author: str | None
    downloads: int
    likes: int
    last_modified: datetime | None
    created_at: datetime | None
    gated: bool | str  # False, "auto" or "manual"
    private: bool
    license: str | None
    tags: tuple[str, ...]
    library_name: str | None
    pipeline_tag: str | None
    format: HubFormat | None
    # (smallest, largest) option in bytes; None until the repo's files are read: the Hub's
    # search answer lists file names at most, never their sizes
    size_range: tuple[int, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "author": self.author,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "gated": self.gated,
            "private": self.private,
            "license": self.license,
            "format": self.format,
            "pipeline_tag": self.pipeline_tag,
            "tags": list(self.tags),
            "size_range": list(self.size_range) if self.size_range else None,
        }


@dataclass(frozen=True, slots=True)
class RepoInfo:
    """One repo, assessed: its files, what can be pulled from it, or why it is refused."""

    id: str
    revision: str  # the commit every download of this view uses
    author: str | None
    format: HubFormat | None
    gated: bool | str
    private: bool
    license: str | None
    downloads: int
    likes: int
    last_modified: datetime | None
    created_at: datetime | None
    tags: tuple[str, ...]
    library_name: str | None
    files: tuple[RepoFile, ...]
    options: tuple[ModelOption, ...]
    refused: str | None  # why Hearth will not download from this repo (None: it will)
    url: str
    warnings: tuple[str, ...] = ()
    card_data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def size_range(self) -> tuple[int, int] | None:
        """The smallest and largest option in bytes (see ``size_range``)."""
        return size_range(self.options)

    def option(self, name: str) -> ModelOption:
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "revision": self.revision,
            "author": self.author,
            "format": self.format,
            "gated": self.gated,
            "private": self.private,
            "license": self.license,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "url": self.url,
            "refused": self.refused,
            "warnings": list(self.warnings),
            "options": [o.as_dict() for o in self.options],
        }


def _license(tags: Iterable[str], card: Any) -> str | None:
    lic = card.get("license") if isinstance(card, dict) else None
    if isinstance(lic, str):
        return lic
    for t in tags:
        if t.startswith("license:"):
            return t.split(":", 1)[1]
    return None


def _format_of(
    names: Sequence[str], tags: Sequence[str], library_name: str | None
) -> HubFormat | None:
    lower = [n.lower() for n in names]
    if any(n.endswith(".gguf") for n in lower):
        return "gguf"
    is_mlx = library_name == "mlx" or "mlx" in tags
    if is_mlx and "config.json" in lower and any(n.endswith(".safetensors") for n in lower):
        return "mlx"
    return None


def group_gguf(files: Iterable[RepoFile]) -> tuple[list[ModelOption], list[str]]:
    """GGUF files grouped by quantization: a sharded model (``-00001-of-00003``) is one option
    with its summed size; vision projectors (``mmproj``) are not models. Returns (options, notes).
    """
    singles: list[RepoFile] = []
    shards: dict[tuple[str, str], dict[int, RepoFile]] = {}
    notes: list[str] = []
    for f in files:
        base = f.path.rsplit("/", 1)[-1]
        if not base.lower().endswith(".gguf") or base.lower().startswith("mmproj"):
            continue
        m = SHARD_RE.match(f.path)
        if m:
            shards.setdefault((m["stem"], m["n"]), {})[int(m["idx"])] = f
        else:
            singles.append(f)
    options: list[ModelOption] = []
    for f in singles:
        q = quant_of(f.path)
        stem = f.path.rsplit("/", 1)[-1][:-5]
        options.append(ModelOption(q or stem, "gguf", q, (f,), f.size or 0))
    for (stem, n), parts in shards.items():
        total = int(n)
        if sorted(parts) != list(range(1, total + 1)):
            notes.append(f"{stem}: shards missing ({len(parts)} of {total}); skipped")
            continue
        ordered = tuple(parts[i] for i in range(1, total + 1))
        q = quant_of(stem)
        label = q or stem.rsplit("/", 1)[-1]
        options.append(ModelOption(label, "gguf", q, ordered, sum(p.size or 0 for p in ordered)))
    # two files with one quantization (e.g. two variants): name them by file instead
    counts: dict[str, int] = {}
    for o in options:
        counts[o.name] = counts.get(o.name, 0) + 1
    named = []
    for o in options:
        if counts[o.name] > 1:
            stem = SHARD_RE.sub(r"\g<stem>", o.first_file.path.rsplit("/", 1)[-1])
            stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
            o = ModelOption(stem, o.format, o.quantization, o.files, o.size_bytes)
        named.append(o)
    named.sort(key=lambda o: (o.size_bytes, o.name))
    return named, notes


def mlx_files(files: Iterable[RepoFile]) -> list[RepoFile]:
    """The files an MLX folder needs (top-level weights, config and tokenizer; never code)."""
    out = []
    for f in files:
        if "/" in f.path:
            continue
        low = f.path.lower()
        if low in MLX_SKIP or not low.endswith(MLX_SUFFIXES):
            continue
        out.append(f)
    return out


def remote_code_reason(config: Any, tags: Iterable[str] = ()) -> str | None:
    """Why a model config would make a loader run code from the repo, or None.

    ``auto_map`` is transformers' ``trust_remote_code`` hook; ``model_file`` is mlx-lm's.
    """
    if "custom_code" in set(tags):
        return "the repo is tagged custom_code (it needs trust_remote_code)"
    if not isinstance(config, dict):
        return None
    if config.get("auto_map"):
        return "its config has an auto_map (it needs trust_remote_code)"
    if config.get("trust_remote_code"):
        return "its config asks for trust_remote_code"
    if config.get("model_file"):
        return "its config names a model_file (Python code the loader would import)"
    tok = config.get("tokenizer_config")
    if isinstance(tok, dict) and tok.get("auto_map"):
        return "its tokenizer config has an auto_map (custom tokenizer code)"
    return None


def assess(
    files: Sequence[RepoFile],
    *,
    tags: Sequence[str] = (),
    library_name: str | None = None,
    config: Any = None,
    unsafe: Sequence[str] = (),
) -> tuple[HubFormat | None, list[ModelOption], str | None, list[str]]:
    """Decide what can be pulled from a repo. Returns (format, options, refusal, warnings)."""
    names = [f.path for f in files]
    warnings = [f"skipped an unsafe file name: {_shown(n)}" for n in unsafe]
    fmt = _format_of(names, tags, library_name)
    lower = [n.lower() for n in names]
    if fmt is None:
        if any(n.endswith(PICKLE_SUFFIXES) for n in lower) and not any(
            n.endswith((".safetensors", ".gguf")) for n in lower
        ):
            return (
                None,
                [],
                (
                    "this repo has only pickle weights (.bin/.pt/.pth/.pkl/.ckpt), which can run code "
                    "when loaded; Hearth downloads GGUF files and MLX safetensors only"
                ),
                warnings,
            )
        if unsafe and any(str(n).lower().endswith(".gguf") for n in unsafe):
            return None, [], "every GGUF file in this repo has an unsafe name", warnings
        return None, [], "this repo has no GGUF files and is not an MLX model", warnings
    if fmt == "mlx":
        why = remote_code_reason(config, tags)
        if why:
            return fmt, [], f"refusing this MLX repo: {why}", warnings
        chosen = mlx_files(files)
        size = sum(f.size or 0 for f in chosen)
        return (
            fmt,
            [ModelOption("mlx", "mlx", _mlx_bits(config), tuple(chosen), size)],
            None,
            warnings,
        )
    options, notes = group_gguf(files)
    warnings.extend(notes)
    if not options:
        return fmt, [], "this repo has no usable GGUF model files", warnings
    return fmt, options, None, warnings


def size_range(options: Iterable[ModelOption]) -> tuple[int, int] | None:
    """(smallest, largest) download among a repo's options, in bytes: per GGUF quantization
    (a sharded one counts as the sum of its shards), the whole folder for MLX. Options with a
    file of unknown size are left out; None when nothing is left.
    """
    sizes = [o.size_bytes for o in options if o.files and all(f.size is not None for f in o.files)]
    return (min(sizes), max(sizes)) if sizes else None


def _mlx_bits(config: Any) -> str | None:
    q = config.get("quantization") if isinstance(config, dict) else None
    if isinstance(q, dict) and isinstance(q.get("bits"), int):
        return f"{q['bits']}bit"
    return None


def choose(info: RepoInfo, *, quant: str | None = None, filename: str | None = None) -> ModelOption:
    """The option a pull means: a named file, a quantization (case-insensitive), Q4_K_M, or the
    only one there is.

    Raises:
        RepoRefused: the repo is refused.
        RepoNotFound: the named file is not a model in this repo.
        AmbiguousChoice: several options and nothing says which (``choices`` lists them).
    """
    if info.refused:
        raise RepoRefused(f"{info.id}: {info.refused}")
    if filename:
        check_repo_path(filename)
        for o in info.options:
            if any(f.path == filename for f in o.files):
                return o
        raise RepoNotFound(f"{info.id} has no model file '{filename}'", param="model")
    if quant:
        want = quant.upper()
        hits = [o for o in info.options if (o.quantization or "").upper() == want]
        hits = hits or [o for o in info.options if o.name.upper() == want]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise AmbiguousChoice(
                f"{info.id} has no {quant} file. Choose one of: "
                + ", ".join(o.name for o in info.options),
                choices=choices(info),
            )
        raise AmbiguousChoice(
            f"{info.id} has several {quant} files; name one with {info.id}/FILE",
            choices=[f"{info.id}/{o.first_file.path}" for o in hits],
        )
    if len(info.options) == 1:
        return info.options[0]
    default = [o for o in info.options if o.quantization == DEFAULT_QUANT]
    if len(default) == 1:
        return default[0]
    raise AmbiguousChoice(
        f"{info.id} has {len(info.options)} model files; choose one with {info.id}:QUANT",
        choices=choices(info),
    )


def choices(info: RepoInfo) -> list[str]:
    return [f"{info.id}:{o.name}" for o in info.options]


# -- the client ---------------------------------------------------------------------------------------
class HubClient:
    """Search and inspect Hub repos through huggingface_hub; read GGUF headers remotely.

    Args:
        endpoint: the Hub's base URL; None = ``HF_ENDPOINT`` or https://huggingface.co.
        token: a token string, or a callable that returns the current one (settings change);
            None = huggingface_hub's own (``HF_TOKEN``, ``hf auth login``).
        memory_probe: what this machine can hold, for fit verdicts (tests pass a fake machine).
        context_length: the context a fit verdict assumes.
    """

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        token: str | Callable[[], str | None] | None = None,
        memory_probe: Callable[[], fitlib.DeviceMemory] = fitlib.probe_memory,
        context_length: int = 4096,
        timeout: float = 30.0,
    ) -> None:
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip(
            "/"
        )
        self._token = token
        self.memory_probe = memory_probe
        self.context_length = context_length
        self.timeout = timeout
        # one limit per event loop on concurrent repo lookups for search-result sizes
        self._size_limits: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Semaphore
        ] = weakref.WeakKeyDictionary()

    # -- plumbing shared with the DownloadManager ------------------------------------------
    def token(self) -> str | None:
        t = self._token() if callable(self._token) else self._token
        return t or None

    def api(self) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=self.token())

    def headers(self) -> dict[str, str]:
        """Auth and user-agent headers for a file request (never logged)."""
        return build_hf_headers(token=self.token(), library_name="hearth")

    def file_url(self, repo_id: str, path: str, revision: str) -> str:
        return hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)

    def repo_url(self, repo_id: str) -> str:
        return f"{self.endpoint}/{repo_id}"

    def http(self) -> httpx2.AsyncClient:
        """huggingface_hub's async HTTP client (honours a user-set client factory)."""
        return get_async_session()

    def access_error(self, repo_id: str, status: int, *, gated: bool = True) -> AccessDenied:
        url = self.repo_url(repo_id)
        has_token = self.token() is not None or build_hf_headers().get("authorization")
        if has_token:
            msg = (
                f"Access to {repo_id} is restricted (HTTP {status}) and your Hugging Face token "
                f"cannot download it. Accept the model's conditions at {url} with the account "
                f"that owns the token, then try again."
            )
        else:
            msg = (
                f"{repo_id} is {'gated' if gated else 'private'} (HTTP {status}): accept its "
                f"conditions at {url}, then set a Hugging Face access token in Hearth's settings "
                f"(or HF_TOKEN) and try again."
            )
        return AccessDenied(msg, url=url)

    def _map_error(self, repo_id: str, e: Exception) -> HearthError:
        if isinstance(e, GatedRepoError):
            status = e.response.status_code if e.response is not None else 403
            return self.access_error(repo_id, status)
        if isinstance(e, RevisionNotFoundError):
            return RepoNotFound(f"{repo_id}: revision not found", param="model")
        if isinstance(e, RepositoryNotFoundError):
            return RepoNotFound(
                f"{repo_id} was not found on {self.endpoint}. If it is private or gated, set a "
                f"Hugging Face token in Hearth's settings (or HF_TOKEN). {self.repo_url(repo_id)}",
                param="model",
            )
        if isinstance(e, HfHubHTTPError):
            status = e.response.status_code if e.response is not None else "?"
            return HubUnavailable(f"the Hub answered HTTP {status} for {repo_id}")
        if isinstance(e, OfflineModeIsEnabled):
            return HubUnavailable("HF_HUB_OFFLINE is set: the Hub is not contacted")
        return HubUnavailable(f"cannot reach {self.endpoint}: {e}")

    # -- search ----------------------------------------------------------------------------
    async def search(
        self,
        query: str = "",
        *,
        format: HubFormat | None = "gguf",
        sort: Sort = "downloads",
        author: str | None = None,
        limit: int = 30,
    ) -> list[ModelSummary]:
        """Search models: GGUF (``filter=gguf``) or MLX (``library=mlx``) repos, best first.

        Raises:
            HubUnavailable: the Hub cannot be reached.
            InvalidRequest-like ``RepoRefused``: a bad sort key.
        """
        if sort not in SORT_PARAMS:
            raise RepoRefused(f"unknown sort '{sort}' (use {', '.join(SORT_PARAMS)})")
        limit = max(1, min(int(limit), 500))

        def run() -> list[ModelSummary]:
            items = self.api().list_models(
                search=query or None,
                filter=format,
                author=author or None,
                sort=SORT_PARAMS[sort],  # type: ignore[arg-type]
                limit=limit,
                expand=SEARCH_EXPAND,  # type: ignore[arg-type]
            )
            return [self._summary(m) for m in items]

        try:
            return await asyncio.to_thread(run)
        except (HfHubHTTPError, httpx2.HTTPError, OSError, OfflineModeIsEnabled) as e:
            raise self._map_error(query or "search", e) from e

    async def repo_size_range(self, repo_id: str) -> tuple[int, int] | None:
        """A search result's size range, from the repo's file list (one ``model_info`` call with
        file metadata; the search answer cannot carry sizes). At most ``SIZE_CONCURRENCY`` of
        these run at once per loop, however many a caller starts.

        Raises:
            RepoRefused, RepoNotFound, AccessDenied, HubUnavailable: as ``repo``.
        """
        loop = asyncio.get_running_loop()
        limit = self._size_limits.get(loop)
        if limit is None:
            limit = self._size_limits[loop] = asyncio.Semaphore(SIZE_CONCURRENCY)
        async with limit:
            info = await self.repo(repo_id, with_fit=False)
        return info.size_range

    async def with_sizes(self, results: Sequence[ModelSummary]) -> list[ModelSummary]:
        """``results`` with ``size_range`` filled in where the repo's files could be read (a repo
        that fails keeps None; the failure is logged)."""

        async def one(s: ModelSummary) -> ModelSummary:
            if s.size_range is not None:
                return s
            try:
                return replace(s, size_range=await self.repo_size_range(s.id))
            except HearthError as e:
                log.info("%s: no size range: %s", s.id, e.message)
                return s

        return list(await asyncio.gather(*(one(s) for s in results)))

    def _summary(self, m: Any) -> ModelSummary:
        tags = tuple(t for t in (m.tags or ()) if isinstance(t, str))
        card = m.card_data.to_dict() if hasattr(m.card_data, "to_dict") else m.card_data
        return ModelSummary(
            id=m.id,
            author=m.author or m.id.split("/")[0],
            downloads=int(m.downloads or 0),
            likes=int(m.likes or 0),
            last_modified=m.last_modified,
            created_at=m.created_at,
            gated=m.gated if m.gated in ("auto", "manual") else bool(m.gated),
            private=bool(m.private),
            license=_license(tags, card),
            tags=tags,
            library_name=m.library_name,
            pipeline_tag=m.pipeline_tag,
            format="gguf"
            if "gguf" in tags
            else "mlx"
            if (m.library_name == "mlx" or "mlx" in tags)
            else None,
        )

    # -- one repo ----------------------------------------------------------------------------
    async def repo(
        self, repo_id: str, *, revision: str | None = None, with_fit: bool = True
    ) -> RepoInfo:
        """A repo's files grouped into options, each with size and (``with_fit``) a fit verdict.

        Raises:
            RepoRefused: a malformed repo id.
            RepoNotFound, AccessDenied, HubUnavailable.
        """
        check_repo_id(repo_id)

        def run() -> Any:
            return self.api().model_info(repo_id, revision=revision, files_metadata=True)

        try:
            m = await asyncio.to_thread(run)
        except (HfHubHTTPError, httpx2.HTTPError, OSError, OfflineModeIsEnabled) as e:
            raise self._map_error(repo_id, e) from e
        files: list[RepoFile] = []
        unsafe: list[str] = []
        for s in m.siblings or ():
            try:
                check_repo_path(s.rfilename)
            except RepoRefused:
                unsafe.append(s.rfilename)
                continue
            lfs = s.lfs
            sha = lfs.sha256 if lfs is not None else None
            size = lfs.size if lfs is not None else s.size
            if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", str(sha)):
                sha = None  # an oid that is not a sha256 cannot verify anything
            blob = (
                s.blob_id
                if isinstance(s.blob_id, str) and re.fullmatch(r"[0-9a-f]{40}", s.blob_id)
                else None
            )
            files.append(RepoFile(s.rfilename, size, sha, blob))
        tags = tuple(t for t in (m.tags or ()) if isinstance(t, str))
        card = m.card_data.to_dict() if hasattr(m.card_data, "to_dict") else (m.card_data or {})
        fmt, options, refused, warnings = assess(
            files, tags=tags, library_name=m.library_name, config=m.config, unsafe=unsafe
        )
        for w in warnings:
            log.warning("%s: %s", repo_id, w)
        info = RepoInfo(
            id=_canonical(repo_id, m.id),
            revision=m.sha or revision or "main",
            author=m.author or repo_id.split("/")[0],
            format=fmt,
            gated=m.gated if m.gated in ("auto", "manual") else bool(m.gated),
            private=bool(m.private),
            license=_license(tags, card),
            downloads=int(m.downloads or 0),
            likes=int(m.likes or 0),
            last_modified=m.last_modified,
            created_at=m.created_at,
            tags=tags,
            library_name=m.library_name,
            files=tuple(files),
            options=tuple(options),
            refused=refused,
            url=self.repo_url(repo_id),
            warnings=tuple(warnings),
            card_data=card if isinstance(card, dict) else {},
        )
        if with_fit and info.options and not info.refused:
            info = await self.with_fit(info)
        return info

    async def with_fit(self, info: RepoInfo, *, concurrency: int = 4) -> RepoInfo:
        """``info`` with a fit verdict on every option (headers read remotely, a few at a time)."""
        memory = await asyncio.to_thread(self.memory_probe)
        sem = asyncio.Semaphore(concurrency)

        async def one(o: ModelOption) -> ModelOption:
            async with sem:
                return await self.fit_option(info, o, memory)

        opts = await asyncio.gather(*(one(o) for o in info.options))
        return replace(info, options=tuple(opts))

    async def fit_option(
        self, info: RepoInfo, option: ModelOption, memory: fitlib.DeviceMemory | None = None
    ) -> ModelOption:
        """One option with its memory estimate and verdict (fits-gpu / fits-ram / too-large)."""
        if memory is None:
            memory = await asyncio.to_thread(self.memory_probe)
        if option.format == "mlx":
            # no GGUF header: weights as stored plus the same runtime overhead
            total = option.size_bytes + fitlib.MLX_OVERHEAD
            est = fitlib.MemoryEstimate(
                option.size_bytes, 0, 0, fitlib.MLX_OVERHEAD, self.context_length
            )
            return replace(option, fit=fitlib.verdict(total, memory), estimate=est)
        first = option.first_file
        try:
            header = await self.read_header(
                info.id, first.path, revision=info.revision, size=first.size
            )
        except HearthError as e:
            log.info("%s/%s: no fit estimate: %s", info.id, first.path, e.message)
            return replace(option, fit_error=e.message)
        est = fitlib.estimate_gguf(header, context_length=self.context_length)
        if option.sharded:  # the first shard's tensor table covers only its own tensors
            est = fitlib.MemoryEstimate(
                option.size_bytes, est.kv_cache, est.compute, est.overhead, est.context_length
            )
        return replace(option, fit=fitlib.verdict(est.total, memory), estimate=est)

    async def read_header(
        self, repo_id: str, path: str, *, revision: str, size: int | None
    ) -> gguf.GGUFHeader:
        """Read and validate a GGUF header over HTTP: the first 2 MiB, more while it needs more.

        Raises:
            InvalidModel: a malformed header (or one larger than 64 MiB).
            AccessDenied, RepoNotFound, HubUnavailable.
        """
        check_repo_path(path)
        url = self.file_url(repo_id, path, revision)
        want = HEADER_FIRST_READ if size is None else min(size, HEADER_FIRST_READ)
        buf = bytearray()
        async with self.http() as client:
            while True:
                await self._read_range(client, repo_id, url, buf, want)
                total = size if size is not None else None
                try:
                    return gguf.parse_header(bytes(buf), file_size=total)
                except gguf.TruncatedHeader as e:
                    if size is not None and len(buf) >= size:
                        raise InvalidModel(f"invalid GGUF: {path} ends inside its header") from e
                    nxt = max(want * 2, e.needed + 64 * 1024)
                    if nxt > HEADER_MAX_READ:
                        raise InvalidModel(
                            f"the GGUF header of {path} is larger than {HEADER_MAX_READ} bytes"
                        ) from e
                    want = nxt if size is None else min(size, nxt)

    async def _read_range(
        self, client: httpx2.AsyncClient, repo_id: str, url: str, buf: bytearray, want: int
    ) -> None:
        """Extend ``buf`` to ``want`` bytes from the file's start (Range; a 200 is cut short)."""
        start = len(buf)
        headers = {
            **self.headers(),
            "Range": f"bytes={start}-{want - 1}",
            "Accept-Encoding": "identity",
        }
        try:
            async with client.stream(
                "GET", url, headers=headers, timeout=httpx2.Timeout(self.timeout)
            ) as r:
                if r.status_code in (401, 403):
                    raise self.access_error(repo_id, r.status_code)
                if r.status_code == 404:
                    raise RepoNotFound(f"{repo_id}: file not found", param="model")
                if r.status_code not in (200, 206):
                    raise HubUnavailable(f"the Hub answered HTTP {r.status_code} for {url}")
                if r.status_code == 200 and start:
                    del buf[:]  # the server ignored Range: this is the file from byte 0
                async for chunk in r.aiter_bytes():
                    buf += chunk
                    if len(buf) >= want:
                        break
        except httpx2.HTTPError as e:
            raise HubUnavailable(f"cannot read {url}: {e}") from e
        del buf[want:]

    async def check_access(self, repo_id: str, path: str, *, revision: str) -> None:
        """Fail early, before queuing a download, when the token cannot read a gated file.

        Raises:
            AccessDenied: 401/403 (the message links to the repo page).
            RepoNotFound: 404.
        """
        url = self.file_url(repo_id, path, revision)
        headers = {**self.headers(), "Range": "bytes=0-0", "Accept-Encoding": "identity"}
        try:
            async with self.http() as client:
                async with client.stream(
                    "GET", url, headers=headers, timeout=httpx2.Timeout(self.timeout)
                ) as r:
                    if r.status_code in (401, 403):
                        raise self.access_error(repo_id, r.status_code)
                    if r.status_code == 404:
                        raise RepoNotFound(f"{repo_id}: {path} is not on the Hub", param="model")
        except httpx2.HTTPError as e:  # the download itself retries network trouble
            log.info("access check for %s failed: %s", repo_id, e)

    async def model_card(
        self, repo_id: str, *, revision: str = "main", limit: int = 1 << 20
    ) -> str:
        """The repo's README (model card) as Markdown, without its YAML front matter; "" if none."""
        check_repo_id(repo_id)
        url = self.file_url(repo_id, "README.md", revision)
        try:
            async with self.http() as client:
                async with client.stream(
                    "GET", url, headers=self.headers(), timeout=httpx2.Timeout(self.timeout)
                ) as r:
                    if r.status_code == 404:
                        return ""
                    if r.status_code in (401, 403):
                        raise self.access_error(repo_id, r.status_code)
                    if r.status_code != 200:
                        raise HubUnavailable(f"the Hub answered HTTP {r.status_code} for {url}")
                    data = bytearray()
                    async for chunk in r.aiter_bytes():
                        data += chunk
                        if len(data) > limit:
                            break
        except httpx2.HTTPError as e:
            raise HubUnavailable(f"cannot read {url}: {e}") from e
        text = bytes(data[:limit]).decode("utf-8", errors="replace")
        if text.startswith("---"):
            end = text.find("\n---", 3)
            if end != -1:
                text = text[end + 4 :].lstrip("\n")
        return text


def _canonical(asked: str, answered: Any) -> str:
    """The Hub's spelling of the repo id (it fixes case), only when it names the same repo."""
    if (
        isinstance(answered, str)
        and answered.lower() == asked.lower()
        and REPO_ID_RE.match(answered)
    ):
        return answered
    return asked
