"""OpenTelemetry from the environment, end to end: `hearth serve` with
``OTEL_EXPORTER_OTLP_ENDPOINT`` set answers SmolLM2 and, when it stops (SIGTERM), flushes its
spans and metrics to a real OTLP/HTTP receiver: the client's trace continued, the span tree
there, the service named "hearth" (with the operator's resource attributes), and the request
record carrying the same trace id."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from app.core.gateway.records import read_records
from app.paths import AppPaths
from tests.e2e.serveproc import start_serve

pytestmark = pytest.mark.model

TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE}-b7ad6b7169203331-01"


class _Receiver(http.server.ThreadingHTTPServer):
    got: dict[str, list[bytes]]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Receiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        n = int(self.headers.get("Content-Length") or 0)
        self.server.got.setdefault(self.path, []).append(self.rfile.read(n))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    srv = _Receiver(("127.0.0.1", 0), _Handler)
    srv.got = {}
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_serve_exports_spans_and_metrics_on_stop(
    tmp_path: Path, smollm2_path: Path, receiver: _Receiver
) -> None:
    port = receiver.server_address[1]
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=e2e",
        # nothing goes out before the stop: what arrives was flushed by the shutdown
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    s = start_serve(tmp_path / "home", smollm2_path, env_extra=env)
    try:
        (model,) = s.models.values()
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 4,
        }
        st, out = s.post("/v1/chat/completions", body, headers={"traceparent": TRACEPARENT})
        assert st == 200, out
        assert not receiver.got  # batched: nothing yet
    finally:
        assert s.stop() == 0, s.stderr_tail()
    spans = [
        (sp, rs.resource)
        for raw in receiver.got.get("/v1/traces", [])
        for rs in ExportTraceServiceRequest.FromString(raw).resource_spans
        for ss in rs.scope_spans
        for sp in ss.spans
    ]
    assert spans, receiver.got.keys()
    chat = [sp for sp, _ in spans if sp.name == "POST /v1/chat/completions"]
    assert len(chat) == 1 and chat[0].trace_id.hex() == TRACE
    in_trace = {sp.name for sp, _ in spans if sp.trace_id.hex() == TRACE}
    assert {"attempt", "model_load", "queue_wait", "prompt_processing", "generation"} <= in_trace
    gen = next(sp for sp, _ in spans if sp.name == "generation")
    assert gen.parent_span_id == chat[0].span_id
    assert chat[0].start_time_unix_nano <= gen.start_time_unix_nano < gen.end_time_unix_nano
    assert gen.end_time_unix_nano <= chat[0].end_time_unix_nano
    resource = {a.key: a.value.string_value for a in spans[0][1].attributes}
    assert resource["service.name"] == "hearth"
    assert resource["deployment.environment"] == "e2e"
    metrics = {
        m.name
        for raw in receiver.got.get("/v1/metrics", [])
        for rm in ExportMetricsServiceRequest.FromString(raw).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {"hearth.server.request.duration", "hearth.tokens"} <= metrics
    (rec,) = [
        r
        for r in read_records(AppPaths.default(s.home).requests_db)
        if r.route.endswith("/completions")
    ]
    assert rec.trace_id == TRACE
