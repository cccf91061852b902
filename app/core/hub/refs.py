"""Names and references: what a user may ask to pull, checked before any name becomes a path.
Tested by tests/core/hub/test_client.py and tests/core/hub/test_offline.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from app.core.library.formats import quant_of
from app.errors import RepoRefused

__all__ = [
    "HUB_HOSTS",
    "REPO_ID_RE",
    "HubRef",
    "check_repo_id",
    "check_repo_path",
    "parse_ref",
    "quant_of",
    "shown",
]

_NAME_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_ID_RE = re.compile(rf"^{_NAME_PART}/{_NAME_PART}$")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_CTRL_RE = re.compile(r"[\x00-\x1f\x7f]")
HUB_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` when it is a plain ``owner/name``.

    Raises:
        RepoRefused: anything else (``..``, slashes, drive letters, NUL, ...).
    """
    if not isinstance(repo_id, str) or not REPO_ID_RE.match(repo_id):
        raise RepoRefused(f"'{shown(repo_id)}' is not a Hugging Face repo id (owner/name)")
    if ".." in repo_id or "--" in repo_id:
        raise RepoRefused(
            f"'{shown(repo_id)}' is not a valid repo id ('..' and '--' are not allowed)"
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
        raise RepoRefused(f"refusing the repo file '{shown(path)}': it has {why}")
    return path


def shown(s: object) -> str:
    return repr(s)[1:-1] if isinstance(s, str) else repr(s)


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
        raise RepoRefused(f"'{shown(raw)}' is not a model reference (expected owner/name)")
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
