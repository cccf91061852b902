"""The groups file: create, replace, remove, the bounds of each setting, names that would
shadow something else, and a member that is a provider's bare name."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.gateway.groups.store import (
    GroupConfig,
    GroupStore,
    check,
    from_json,
    member_targets,
)
from app.core.gateway.providers.store import ProviderConfig
from app.errors import InvalidRequest

PROVIDERS = {
    "gpu1": ProviderConfig("gpu1", "http://gpu1:8000/v1"),
    "gpu2": ProviderConfig("gpu2", "http://gpu2:8000/v1"),
}


def test_set_get_replace_remove_and_a_second_reader_sees_it(tmp_path: Path) -> None:
    store = GroupStore(tmp_path / "groups.json")
    store.set(GroupConfig("qwen", ("gpu1", "gpu2/Qwen/Qwen3-8B"), strategy="session"), PROVIDERS)
    other = GroupStore(tmp_path / "groups.json")  # as another process reads it
    got = other.get("qwen")
    assert got is not None and got.members == ("gpu1", "gpu2/Qwen/Qwen3-8B")
    assert got.strategy == "session" and got.failures_to_open == 2 and got.cooldown_s == 15.0
    store.set(GroupConfig("qwen", ("gpu1",)), PROVIDERS, lambda n: None)
    assert store.all(fresh=True)["qwen"].strategy == "least-busy"
    assert store.remove("qwen") and not store.remove("qwen")
    assert store.get("qwen") is None


def test_a_name_that_clashes_or_a_member_naming_no_provider_is_refused(tmp_path: Path) -> None:
    store = GroupStore(tmp_path / "groups.json")
    with pytest.raises(InvalidRequest, match="clashes with the prefix 'gpu1/'") as e:
        store.set(GroupConfig("gpu1/x", ("gpu2",)), PROVIDERS)
    assert e.value.param == "name"
    with pytest.raises(InvalidRequest, match="'gpu3' is neither") as e:
        store.set(GroupConfig("g", ("gpu1", "gpu3")), PROVIDERS)
    assert e.value.param == "members"
    with pytest.raises(InvalidRequest, match="'gpu1/' is neither"):
        store.set(GroupConfig("g", ("gpu1/",)), PROVIDERS)  # a prefix with no model after it
    with pytest.raises(InvalidRequest, match="clashes with the alias 'fast'"):
        store.set(GroupConfig("fast", ("gpu1",)), PROVIDERS, lambda n: "the alias 'fast'")
    with pytest.raises(InvalidRequest, match="reserved"):
        store.set(GroupConfig("auto", ("gpu1",)), PROVIDERS, lambda n: None)


@pytest.mark.parametrize(
    ("cfg", "param"),
    [
        (GroupConfig("g", ()), "members"),
        (GroupConfig("g", ("a", "a")), "members"),
        (GroupConfig("g", ("a",), strategy="random"), "strategy"),
        (GroupConfig("g", ("a",), prefix_tokens=8), "prefix_tokens"),
        (GroupConfig("g", ("a",), health_interval_s=0), "health_interval_s"),
        (GroupConfig("g", ("a",), health_timeout_s=100), "health_timeout_s"),
        (GroupConfig("g", ("a",), cooldown_s=0), "cooldown_s"),
        (GroupConfig("g", ("a",), failures_to_open=0), "failures_to_open"),
        (GroupConfig("g", ("a",), health_path="health"), "health_path"),
    ],
)
def test_settings_out_of_bounds_are_refused_naming_the_field(cfg: GroupConfig, param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        check(cfg)
    assert e.value.param == param


def test_from_json_refuses_unknown_fields_and_wrong_types() -> None:
    with pytest.raises(InvalidRequest) as e:
        from_json("g", {"members": ["a"], "stratgy": "session"})
    assert e.value.param == "stratgy"
    with pytest.raises(InvalidRequest) as e:
        from_json("g", {"members": ["a"], "cooldown_s": "15"})
    assert e.value.param == "cooldown_s"
    with pytest.raises(InvalidRequest) as e:
        from_json("g", {"members": "a"})
    assert e.value.param == "members"
    got = from_json("g", {"members": ["a"], "prefix_tokens": 512, "cooldown_s": 3})
    assert got.prefix_tokens == 512 and got.cooldown_s == 3.0


def test_a_bare_provider_name_stands_for_its_prefix_and_the_group_name() -> None:
    cfg = GroupConfig("qwen3", ("gpu1", "lan/Qwen/Qwen3-8B", "ghost"))
    prefixes = {"gpu1": "g1/", "lan": "lan/"}
    assert member_targets(cfg, prefixes.get) == ["g1/qwen3", "lan/Qwen/Qwen3-8B", "ghost"]


def test_an_invalid_group_in_the_file_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "groups.json"
    path.write_text('{"groups": {"ok": {"members": ["a"]}, "bad": {"members": []}}}')
    assert list(GroupStore(path).all()) == ["ok"]
