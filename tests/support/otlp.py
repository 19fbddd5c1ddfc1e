"""A small real OTLP/HTTP trace receiver on loopback: it decodes every ExportTraceServiceRequest
(protobuf, as the SDK's exporter sends it) and keeps the spans, so a test judges traces from what
actually arrived over the wire, never from the engine's own belief. It lives in the test
process, so a worker SIGKILLed mid-run cannot take what it already exported with it."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class Link:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[Link, ...]
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]
    start_ns: int
    end_ns: int


class Receiver:
    """Collects the spans POSTed to `url` + `/v1/traces` (what OTEL_EXPORTER_OTLP_ENDPOINT
    names); `requests` counts the export requests it answered; `delay_s` holds each answer
    back (a slow collector)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.delay_s = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                time.sleep(receiver.delay_s)  # a slow collector, when a test asks for one
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: Any) -> None:  # quiet
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    links = tuple(
                        Link(lk.trace_id.hex(), lk.span_id.hex(), _attrs(lk.attributes))
                        for lk in s.links
                    )
                    found.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes=_attrs(s.attributes),
                            links=links,
                            status_code=s.status.code,
                            resource=resource,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.requests += 1
            self._spans.extend(found)

    def spans(self, trace_id: str | None = None) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait_for(self, trace_id: str, name: str, timeout: float = 20.0) -> list[ReceivedSpan]:
        """The trace's spans once one named `name` arrived (the spans come from other
        processes, on their own time); AssertionError with what did arrive otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.spans(trace_id)
            if any(s.name == name for s in spans):
                return spans
            time.sleep(0.05)
        got = sorted({s.name for s in self.spans(trace_id)})
        raise AssertionError(f"no {name} span of trace {trace_id} arrived; got {got}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
