"""Two real ``hearth serve`` gateways (their own HEARTH_HOMEs, ``--state URL``, SmolLM2
preloaded) sharing one real redis-server: a response stored through one is continued
(``previous_response_id``), read and deleted through the other, so a load balancer needs no
stickiness for the Responses API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.hearthproc import Server, wait_until


def gateway(home: Path, url: str, model: Path) -> Server:
    srv = Server(home, None, "--state", url, "--model", str(model))
    wait_until(lambda: srv.api("GET", "/health")[1].get("state") == "ready", "the preload")
    return srv


@pytest.mark.model
def test_a_response_kept_through_one_gateway_is_continued_through_the_other(
    tmp_path: Path, smollm2_path: Path, redis_server: Any
) -> None:
    a = gateway(tmp_path / "a", redis_server.url, smollm2_path)
    try:
        b = gateway(tmp_path / "b", redis_server.url, smollm2_path)
        try:
            model = a.api("GET", "/v1/models")[1]["data"][0]["id"]
            ask = {"model": model, "input": "Name a fruit.", "max_output_tokens": 4}
            status, first = a.api("POST", "/v1/responses", {**ask, "temperature": 0})
            assert status == 200, first
            status, got = b.api("GET", f"/v1/responses/{first['id']}")
            assert status == 200 and got["id"] == first["id"]
            status, second = b.api(
                "POST",
                "/v1/responses",
                {**ask, "input": "And another?", "previous_response_id": first["id"]},
            )
            assert status == 200, second
            # the second turn's prompt carried the first: more input tokens than its own words
            assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
            status, items = a.api("GET", f"/v1/responses/{second['id']}/input_items")
            assert status == 200 and len(items["data"]) >= 3
            assert b.api("DELETE", f"/v1/responses/{first['id']}")[0] == 200
            assert a.api("GET", f"/v1/responses/{first['id']}")[0] == 404
        finally:
            assert b.stop() == 0
    finally:
        assert a.stop() == 0
