"""The replica groups routes on the real server: an admin key creates (201), replaces (200),
lists and removes (200, then 404) a group, which /v1/models lists as owned by "group" (and
/api/tags as it lists an alias); a bad
setting is a 400 naming its field; other keys get 403 and no key 401."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.gateway.keys import KeyStore
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.settings import SettingsStore
from tests.conftest import Served, serving
from tests.e2e.engines import free_port

pytestmark = pytest.mark.model

DEFAULT = "the-default-key-for-groups-0123"
ADMIN = "k-admin-groups-0123456789"
USER = "k-user-groups-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    def prepare(service: Any, paths: Any, store: SettingsStore) -> None:
        ks = KeyStore(paths.keys_file)
        ks.add("admin", ADMIN, admin=True)
        ks.add("user", USER)
        providers = ProviderStore(paths.providers_file, paths.provider_keys_file)
        for name in ("gpu1", "gpu2"):  # nothing listens there: the members are unreachable
            url = f"http://127.0.0.1:{free_port()}/v1"
            providers.add(ProviderConfig(name, url, kind="vllm"), None, lambda p: None)

    home = tmp_path_factory.mktemp("groups-routes")
    with serving(home, smollm2_path, prepare=prepare, api_key=DEFAULT) as s:
        yield s


def _call(s: Served, method: str, path: str, key: str | None = ADMIN, body: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, s.root + path, json=body, headers=headers, timeout=60)


def test_an_admin_key_creates_replaces_lists_and_removes_a_group(server: Served) -> None:
    body = {"members": ["gpu1", "gpu2/Qwen/Qwen3-8B"], "strategy": "prefix", "prefix_tokens": 512}
    r = _call(server, "PUT", "/api/v1/providers/groups/qwen", body=body)
    assert r.status_code == 201, r.text
    assert r.json()["strategy"] == "prefix" and r.json()["prefix_tokens"] == 512
    r = _call(server, "PUT", "/api/v1/providers/groups/qwen", body={"members": ["gpu1", "gpu2"]})
    assert r.status_code == 200 and r.json()["strategy"] == "least-busy", r.text
    listed = _call(server, "GET", "/api/v1/providers/groups").json()["groups"]
    assert [g["name"] for g in listed] == ["qwen"]
    members = listed[0]["members"]
    assert [m["target"] for m in members] == ["gpu1/qwen", "gpu2/qwen"]
    assert {m["state"] for m in members} <= {"ready", "unreachable"}  # as its probe found it
    assert all(m["in_flight"] == 0 for m in members)
    models = _call(server, "GET", "/v1/models").json()["data"]
    entry = next(m for m in models if m["id"] == "qwen")
    assert entry["owned_by"] == "group" and entry["targets"] == ["gpu1/qwen", "gpu2/qwen"]
    assert _call(server, "GET", "/v1/models/qwen").json()["owned_by"] == "group"
    tags = [m["name"] for m in _call(server, "GET", "/api/tags").json()["models"]]
    assert any(t.split(":")[0] == "qwen" for t in tags), tags  # Ollama's listing, as an alias
    r = _call(server, "DELETE", "/api/v1/providers/groups/qwen")
    assert r.status_code == 200 and r.json() == {"name": "qwen", "removed": True}
    assert _call(server, "DELETE", "/api/v1/providers/groups/qwen").status_code == 404
    assert _call(server, "GET", "/api/v1/providers/groups").json() == {"groups": []}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"members": ["gpu1"], "strategy": "random"}, "strategy"),
        ({"members": ["gpu1"], "cooldown_s": -1}, "cooldown_s"),
        ({"members": ["gpu1"], "colour": "red"}, "colour"),
        ({"members": ["nobody"]}, "members"),
        ({"members": []}, "members"),
    ],
)
def test_a_bad_group_is_a_400_naming_the_field(server: Served, body: Any, param: str) -> None:
    r = _call(server, "PUT", "/api/v1/providers/groups/g", body=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_group_name_may_not_shadow_a_model_or_a_prefix(server: Served) -> None:
    local = _call(server, "GET", "/v1/models").json()["data"][0]["id"]
    for name in (local, "gpu1", "auto"):
        r = _call(server, "PUT", f"/api/v1/providers/groups/{name}", body={"members": ["gpu2"]})
        assert r.status_code == 400, (name, r.text)


def test_non_admin_keys_get_403_and_no_key_401(server: Served) -> None:
    calls = [
        ("GET", "/api/v1/providers/groups", None),
        ("PUT", "/api/v1/providers/groups/g", {"members": ["gpu1"]}),
        ("DELETE", "/api/v1/providers/groups/g", None),
    ]
    for method, path, body in calls:
        assert _call(server, method, path, key=USER, body=body).status_code == 403
        assert _call(server, method, path, key=None, body=body).status_code == 401
