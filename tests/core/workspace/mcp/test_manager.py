"""The MCP manager against real servers: tests/support/mcp_server.py over stdio and Streamable HTTP.
Tools are listed and called, a timeout, a crash and a garbage-printing server each end as that
server's state while the others go on, and stopping leaves no server process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from app.core.workspace.mcp import McpManager, parse_config
from app.core.workspace.mcp.manager import safe_name
from app.errors import ConfigError
from tests.support.mcp_fixtures import http_mcp_url, pid_alive, stdio_entry, write_config

__all__ = ["http_mcp_url"]  # the fixture, imported for pytest


def test_config_reports_a_bad_entry_by_name_and_keeps_the_others() -> None:
    cfg = parse_config(
        """{"mcpServers": {
            "good": {"command": "x", "args": ["--token=${TOKEN}"], "env": {"K": "${TOKEN}"}},
            "web": {"url": "https://example.test/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
            "nothing": {"args": []},
            "both": {"command": "x", "url": "http://a"},
            "off": {"command": "y", "disabled": true}
        }}""",
        environ={"TOKEN": "s3cret"},
    )
    assert [s.name for s in cfg.servers] == ["good", "web", "off"]
    good, web, off = cfg.servers
    assert good.args == ("--token=s3cret",) and good.env == {"K": "s3cret"}
    assert web.transport == "http" and web.headers == {"Authorization": "Bearer s3cret"}
    assert off.disabled
    assert set(cfg.errors) == {"nothing", "both"}
    assert "'nothing'" in cfg.errors["nothing"] and "command" in cfg.errors["nothing"]


def test_config_that_is_not_json_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="not valid JSON.*line 1"):
        parse_config('{"mcpServers": ')
    with pytest.raises(ConfigError, match="mcpServers"):
        parse_config('{"mcpServers": []}')


def test_tool_names_are_safe_and_unique() -> None:
    taken: set[str] = set()
    assert safe_name("my server", "get.weather", taken) == "my_server__get_weather"
    assert safe_name("my.server", "get weather", taken) == "my_server__get_weather_2"
    long = safe_name("s" * 80, "t", taken)
    assert len(long) == 64


async def test_stdio_and_http_servers_list_and_call_tools_with_a_timeout(
    tmp_path: Path, http_mcp_url: str
) -> None:
    cfg = write_config(
        tmp_path / "mcp.json",
        {
            "local": stdio_entry(),
            "web": {"url": http_mcp_url},
            "off": {**stdio_entry(), "disabled": True},
            "broken": {"command": 42},
        },
    )
    m = McpManager(cfg, log_dir=tmp_path / "logs")
    try:
        states = {s.name: s for s in await m.start()}
        assert states["local"].state == "running" and states["web"].state == "running"
        assert states["off"].state == "disabled"
        assert states["broken"].state == "error" and "'broken'" in states["broken"].error
        names = {t.name for t in m.tools()}
        assert {"local__add", "local__slow", "web__add", "web__echo"} <= names
        add = m.find("local__add")
        assert add is not None and add.tool == "add" and add.server == "local"
        assert add.as_tool().parameters["properties"].keys() == {"a", "b"}
        assert "Add two integers" in add.description
        assert states["local"].summary.startswith("running · ")

        local = await m.call("local__add", {"a": 2, "b": 3})
        web = await m.call("web__add", {"a": 20, "b": 22})
        assert (local.status, local.content) == ("ok", "5")
        assert (web.status, web.content) == ("ok", "42")
        failed = await m.call("web__fail", {"why": "boom"})
        assert failed.status == "error" and "fail" in failed.content
        missing = await m.call("nope__x", {})
        assert missing.status == "error" and "no tool" in missing.content

        slow = await m.call("local__slow", {"seconds": 1}, timeout_s=0.3)
        assert slow.status == "timeout" and "timed out after 0.3 s" in slow.content
        again = await m.call("local__add", {"a": 1, "b": 1})
        assert (again.status, again.content) == ("ok", "2")  # the server goes on
        assert (tmp_path / "logs" / "mcp-local.log").exists()  # its stderr, kept
    finally:
        await m.stop()


async def test_a_crashed_server_is_reported_and_the_other_goes_on(
    tmp_path: Path, http_mcp_url: str
) -> None:
    cfg = write_config(
        tmp_path / "mcp.json", {"local": stdio_entry(), "web": {"url": http_mcp_url}}
    )
    m = McpManager(cfg)
    try:
        await m.start()
        pid = int((await m.call("local__pid", {})).content)
        os.kill(pid, signal.SIGKILL)
        out = await m.call("local__add", {"a": 1, "b": 2})
        assert out.status == "error"
        local = next(s for s in m.statuses() if s.name == "local")
        assert local.state == "error" and "crashed" in local.error
        assert not any(t.server == "local" for t in m.tools())  # no longer offered to the model
        assert (await m.call("web__add", {"a": 1, "b": 2})).content == "3"
        await m.restart("local")  # on demand: a fresh process
        assert (await m.call("local__add", {"a": 1, "b": 2})).content == "3"
    finally:
        await m.stop()


async def test_a_server_printing_garbage_is_reported_without_waiting_out_the_start(
    tmp_path: Path,
) -> None:
    cfg = write_config(
        tmp_path / "mcp.json", {"junk": stdio_entry("garbage"), "local": stdio_entry()}
    )
    m = McpManager(cfg, start_timeout_s=120.0)
    try:
        began = time.monotonic()
        states = {s.name: s for s in await m.start()}
        assert time.monotonic() - began < 100.0  # reported, not the start timeout's end
        assert states["junk"].state == "error" and "not JSON-RPC" in states["junk"].error
        assert states["local"].state == "running"
        assert (await m.call("local__add", {"a": 2, "b": 2})).content == "4"
    finally:
        await m.stop()


async def test_a_missing_command_is_that_servers_error(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path / "mcp.json", {"ghost": {"command": str(tmp_path / "no-such-server")}}
    )
    m = McpManager(cfg)
    try:
        (st,) = await m.start()
        assert st.state == "error" and "cannot start" in st.error
    finally:
        await m.stop()


async def test_stopping_leaves_no_server_process(tmp_path: Path) -> None:
    m = McpManager(write_config(tmp_path / "mcp.json", {"a": stdio_entry(), "b": stdio_entry()}))
    await m.start()
    pids = [int((await m.call(f"{n}__pid", {})).content) for n in ("a", "b")]
    assert all(pid_alive(p) for p in pids)
    await m.stop()
    assert not any(pid_alive(p) for p in pids)
    assert m.statuses() == [] and m.tools() == []


def test_mcp_settings_keys() -> None:
    from app.paths import AppPaths
    from app.settings import Settings, settings_from_dict

    assert (Settings().mcp.call_timeout_s, Settings().mcp.max_rounds) == (60.0, 8)
    s = settings_from_dict({"mcp": {"call_timeout_s": 5, "max_rounds": 2}})
    assert (s.mcp.call_timeout_s, s.mcp.max_rounds) == (5.0, 2)
    assert settings_from_dict(s.to_dict()).mcp == s.mcp  # saved and read back
    with pytest.raises(ConfigError, match="mcp.max_rounds"):
        settings_from_dict({"mcp": {"max_rounds": 0}})
    with pytest.raises(ConfigError, match="mcp.call_timeout_s"):
        settings_from_dict({"mcp": {"call_timeout_s": -1}})
    assert AppPaths.default("/x").mcp_file.name == "mcp.json"


def test_the_manager_reads_the_mcp_settings_live(tmp_path: Path) -> None:
    from dataclasses import replace

    from app.settings import McpSettings, SettingsStore

    store = SettingsStore(tmp_path / "settings.json")
    m = McpManager(tmp_path / "mcp.json", live=lambda: store.load().mcp)
    assert (m.limit("call_timeout_s"), m.limit("max_rounds")) == (60.0, 8)
    store.save(replace(store.load(), mcp=McpSettings(call_timeout_s=7, max_rounds=3)))
    assert (m.limit("call_timeout_s"), m.limit("max_rounds")) == (7.0, 3)
