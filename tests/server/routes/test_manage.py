"""The keys and providers management routes on the real server: an admin key lists,
adds and removes keys and providers; other keys get 403 permission_denied; a key made over HTTP
works at the next request and a removed one gets 401; no listing (nor the request records, with
content recording on) ever holds a secret."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.gateway.keys import KeyStore
from app.settings import RecordSettings, SettingsStore
from tests.conftest import Served, serving
from tests.support.records import records_with

pytestmark = pytest.mark.model

DEFAULT = "the-default-key-for-manage-0123"
ADMIN = "k-admin-manage-0123456789"
USER = "k-user-manage-0123456789"
LISTING_FIELDS = {"name", "rpm", "tpm", "models", "admin", "created_at", "last_used_at"}
DEADLINE = 60.0


@dataclass
class Managed:
    s: Served

    def call(
        self, method: str, path: str, key: str | None = ADMIN, body: object = None
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.request(
            method, self.s.root + path, json=body, headers=headers, timeout=DEADLINE
        )

    @property
    def keys_file(self) -> Path:
        return self.s.home / "config" / "keys.json"


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Managed]:
    def prepare(service: Any, paths: Any, store: SettingsStore) -> None:
        # content recording on: the routes' bodies (a provider's API key) must still not be kept
        store.update(records=RecordSettings(log_content=True))
        ks = KeyStore(paths.keys_file)
        ks.add("admin", ADMIN, admin=True)
        ks.add("user", USER)

    home = tmp_path_factory.mktemp("manage")
    with serving(home, smollm2_path, prepare=prepare, api_key=DEFAULT) as s:
        yield Managed(s)


def error(r: httpx.Response) -> dict[str, object]:
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}  # the OpenAI shape
    return dict(err)


def test_an_admin_key_lists_adds_and_removes_keys(managed: Managed) -> None:
    r = managed.call("GET", "/api/v1/keys")
    assert r.status_code == 200, r.text
    listed = r.json()["keys"]
    assert [k["name"] for k in listed] == ["admin", "user"]
    # the objects of `hearth keys ls --json`: no hash, no secret
    assert listed == [k.public() for k in KeyStore(managed.keys_file).all().values()]
    for k in listed:
        assert set(k) == LISTING_FIELDS
    assert ADMIN not in r.text and USER not in r.text and "hash" not in r.text

    mid = managed.s.model_id
    body = {"name": "carol", "rpm": 600, "tpm": 0, "models": [mid], "admin": False}
    r = managed.call("POST", "/api/v1/keys", body=body)
    assert r.status_code == 201, r.text
    made = r.json()
    secret = made.pop("key")
    assert isinstance(secret, str) and len(secret) >= 20
    assert set(made) == LISTING_FIELDS
    assert (made["name"], made["rpm"], made["models"], made["admin"]) == (
        "carol",
        600,
        [mid],
        False,
    )
    assert secret not in managed.keys_file.read_text()  # stored as a hash only

    # it works at once, with its limits and scope
    r = managed.call("GET", "/v1/models", key=secret)
    assert r.status_code == 200 and {m["id"] for m in r.json()["data"]} == {mid}
    assert r.headers["x-ratelimit-limit-requests"] == "600"
    # it is listed like the others, its secret never again
    r = managed.call("GET", "/api/v1/keys")
    assert [k["name"] for k in r.json()["keys"]] == ["admin", "user", "carol"]
    assert secret not in r.text

    r = managed.call("POST", "/api/v1/keys", body={"name": "carol"})
    assert r.status_code == 409 and error(r)["code"] == "already_exists"
    assert error(r)["param"] == "name"

    r = managed.call("DELETE", "/api/v1/keys/carol")
    assert r.status_code == 200 and r.json() == {"name": "carol", "removed": True}
    r = managed.call("GET", "/v1/models", key=secret)
    assert r.status_code == 401 and error(r)["code"] == "invalid_api_key"
    r = managed.call("DELETE", "/api/v1/keys/carol")
    assert r.status_code == 404 and error(r)["code"] == "not_found"
    assert [k.name for k in KeyStore(managed.keys_file).all().values()] == ["admin", "user"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"name": "has space"}, "name"),
        ({"name": "default"}, "name"),  # the --api-key key's name
        ({}, "name"),
        ({"name": 5}, "name"),
        ({"name": "x", "rpm": -1}, "rpm"),
        ({"name": "x", "tpm": "many"}, "tpm"),
        ({"name": "x", "models": "m*"}, "models"),
        ({"name": "x", "admin": "yes"}, "admin"),
        ({"name": "x", "rmp": 5}, "rmp"),  # a typo is refused, not a key without its limit
    ],
)
def test_an_invalid_key_is_a_400_naming_the_field(
    managed: Managed, body: dict[str, object], param: str
) -> None:
    r = managed.call("POST", "/api/v1/keys", body=body)
    assert r.status_code == 400, r.text
    err = error(r)
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert "x" not in KeyStore(managed.keys_file).all()


def test_non_admin_keys_get_403_on_every_keys_and_providers_route(managed: Managed) -> None:
    calls = [
        ("GET", "/api/v1/keys", None),
        ("POST", "/api/v1/keys", {"name": "sneaky", "admin": True}),
        ("DELETE", "/api/v1/keys/admin", None),
        ("GET", "/api/v1/providers", None),
        ("POST", "/api/v1/providers", {"name": "p", "url": "http://127.0.0.1:9/v1"}),
        ("DELETE", "/api/v1/providers/p", None),
        ("POST", "/api/v1/providers/p/test", None),
    ]
    for method, path, body in calls:
        r = managed.call(method, path, key=USER, body=body)
        assert r.status_code == 403, (method, path, r.text)
        assert error(r)["code"] == "permission_denied"
        assert managed.call(method, path, key=None, body=body).status_code == 401
    assert [k.name for k in KeyStore(managed.keys_file).all().values()] == ["admin", "user"]
    # the single --api-key key is an admin key
    assert managed.call("GET", "/api/v1/keys", key=DEFAULT).status_code == 200


def _provider(managed: Managed, name: str) -> dict[str, object] | None:
    r = managed.call("GET", "/api/v1/providers")
    assert r.status_code == 200, r.text
    return next((p for p in r.json()["providers"] if p["name"] == name), None)


def test_an_admin_key_adds_tests_and_removes_a_provider(managed: Managed) -> None:
    assert managed.call("GET", "/api/v1/providers").json() == {"providers": []}
    # this very server as the provider, with a key it accepts; no kind: it is detected
    body = {"name": "self", "url": managed.s.base_url, "api_key": DEFAULT, "idle_timeout": 30}
    r = managed.call("POST", "/api/v1/providers", body=body)
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["name"], made["kind"], made["prefix"], made["url"]) == (
        "self",
        "hearth",
        "self/",
        managed.s.base_url,
    )
    assert made["idle_timeout"] == 30 and made["has_api_key"] is True
    assert "detect_warning" not in made and DEFAULT not in r.text

    deadline = time.monotonic() + DEADLINE
    while (p := _provider(managed, "self")) is None or p["state"] != "ready":
        assert time.monotonic() < deadline, p
        time.sleep(0.05)
    # the objects of `hearth providers ls --json`, never its key
    assert set(p) == {"name", "url", "kind", "prefix", "state", "models", "latency_ms", "error"}
    assert f"self/{managed.s.model_id}" in p["models"]  # type: ignore[operator]
    listing = managed.call("GET", "/api/v1/providers").text
    assert DEFAULT not in listing and "api_key" not in listing

    r = managed.call("POST", "/api/v1/providers/self/test")
    assert r.status_code == 200, r.text
    test = r.json()
    assert test["ok"] is True, test
    assert [s["step"] for s in test["steps"]] == ["health", "models", "chat"]

    # replace: same name, now with its kind given (no detection) and no key
    r = managed.call(
        "POST",
        "/api/v1/providers",
        body={"name": "self", "url": managed.s.base_url, "kind": "openai"},
    )
    assert (
        r.status_code == 200 and r.json()["kind"] == "openai" and r.json()["has_api_key"] is False
    )
    assert DEFAULT not in (managed.s.home / "config" / "provider_keys.json").read_text()

    r = managed.call("DELETE", "/api/v1/providers/self")
    assert r.status_code == 200 and r.json() == {"name": "self", "removed": True}
    assert _provider(managed, "self") is None
    for method, path in (
        ("DELETE", "/api/v1/providers/self"),
        ("POST", "/api/v1/providers/self/test"),
    ):
        r = managed.call(method, path)
        assert r.status_code == 404 and error(r)["code"] == "not_found", path

    # the records kept the routes' requests but not their bodies (one held the provider's key)
    recs = records_with(
        managed.s.home / "data" / "requests.sqlite",
        lambda x: x.route == "/api/v1/providers/{name}/test",  # the last one's record
    )
    posts = [x for x in recs if x.route == "/api/v1/providers" and x.method == "POST"]
    assert posts and all(x.request_text is None for x in posts)
    assert all(DEFAULT not in (x.request_text or "") for x in recs)


def test_a_provider_whose_kind_cannot_be_detected_is_added_as_openai(managed: Managed) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    r = managed.call("POST", "/api/v1/providers", body={"name": "down", "url": url})
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "openai" and "could not detect" in r.json()["detect_warning"]
    assert _provider(managed, "down") is not None
    assert managed.call("DELETE", "/api/v1/providers/down").status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"url": "http://127.0.0.1:9/v1", "kind": "openai"},
        {"name": "p", "kind": "openai"},
        {"name": "p", "url": "ftp://host/v1", "kind": "openai"},
        {"name": "Bad Name", "url": "http://127.0.0.1:9/v1", "kind": "openai"},
        {"name": "p", "url": "http://127.0.0.1:9/v1", "kind": "nope"},
        {"name": "p", "url": "http://127.0.0.1:9/v1", "kind": "openai", "connect_timeout": -1},
        {"name": "p", "url": "http://127.0.0.1:9/v1", "kind": "openai", "apikey": "x"},
    ],
)
def test_an_invalid_provider_is_a_400(managed: Managed, body: dict[str, object]) -> None:
    r = managed.call("POST", "/api/v1/providers", body=body)
    assert r.status_code == 400, r.text
    assert error(r)["type"] == "invalid_request_error"
    assert _provider(managed, "p") is None
    assert json.loads(r.text)  # an error body, never a traceback
