"""The HTTP client a tool gets for one call (`ctx.http`): the process's pooled client, with
the call's idempotency key and identity on every request and its total timeout.

Every request passes the send guard (`http.py`), whatever client code makes it; the headers
let a vendor dedupe on the key and let the simulators' records judge stale and duplicate writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from runtime.sending import http


class CallHTTP:
    """Sync (`get`, `post`, ...) and async (`aget`, `apost`, ...) requests for one call."""

    def __init__(self, headers: Mapping[str, str], timeout_s: float) -> None:
        self.headers = dict(headers)
        self.timeout_s = timeout_s

    @classmethod
    def for_call(
        cls, *, key: str, run_id: str, attempt: int, call: str, timeout_s: float
    ) -> CallHTTP:
        return cls(
            {
                "Idempotency-Key": key,
                "X-Liyagent-Run": run_id,
                "X-Liyagent-Attempt": str(attempt),
                "X-Liyagent-Call": call,
            },
            timeout_s,
        )

    def _merged(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request's arguments with the call's headers set over the tool's own, whatever
        case the tool wrote them in: one `Idempotency-Key`, the step key (I8), never the tool's
        beside it for the vendor to pick from."""
        headers = httpx.Headers(kwargs.pop("headers", None) or {})
        for name, value in self.headers.items():
            headers[name] = value
        timeout = kwargs.pop("timeout", self.timeout_s)
        return {**kwargs, "headers": headers, "timeout": timeout}

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """One request (httpx's arguments); it never outlives the call's timeout."""
        merged = self._merged(kwargs)
        with http.total_timeout(_seconds(merged["timeout"])):
            return http.shared_client().request(method, url, **merged)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def put(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PUT", url, **kwargs)

    def patch(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", url, **kwargs)

    async def arequest(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        merged = self._merged(kwargs)
        with http.total_timeout(_seconds(merged["timeout"])):
            return await http.shared_async_client().request(method, url, **merged)

    async def aget(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.arequest("GET", url, **kwargs)

    async def apost(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.arequest("POST", url, **kwargs)

    async def aput(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.arequest("PUT", url, **kwargs)

    async def apatch(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.arequest("PATCH", url, **kwargs)

    async def adelete(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.arequest("DELETE", url, **kwargs)


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, int | float):
        return float(timeout)
    if isinstance(timeout, httpx.Timeout):
        parts = [t for t in (timeout.connect, timeout.read, timeout.write, timeout.pool) if t]
        return max(parts) if parts else None
    return None
