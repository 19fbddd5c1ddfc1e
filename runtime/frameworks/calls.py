"""What every framework adapter shares, and imports no framework (each is its own optional
extra; both bring the OpenAI client): the kinds a team declares per tool, the liyagent call a
tool body runs in (`current_call`), the httpx transport that sends a team's own client through
it (`CallTransport`), the send guard's refusal found under an SDK's error, a failed model call
as the engine's ModelError (`model_error`), and the OpenAI client's chat request sent without
its per-message transform (`plain_chat_body`)."""

from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import httpx
import httpx2
import openai

from runtime.base import process
from runtime.models.base import ModelError
from runtime.models.errors import classify, too_large
from runtime.sending import sdk_http
from runtime.sending.bounded import ResponseTooLarge
from runtime.sending.http import SendRefused
from runtime.toolbox.tools import CallContext, ToolDeclarationError, ToolKind
from runtime.toolbox.typed_tools import USER_KINDS, reader_for

T = TypeVar("T")
Reader = Callable[[dict[str, Any], CallContext], Any]

_call: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar(
    "liyagent_framework_call", default=None
)


def current_call() -> CallContext:
    """The liyagent call a tool body runs in: its step key and `http` (the guarded client
    that sends the key); RuntimeError outside one."""
    found = _call.get()
    if found is None:
        raise RuntimeError("no liyagent call is in progress (a tool runs in one on a worker)")
    return found


@contextmanager
def in_call(ctx: CallContext) -> Iterator[None]:
    """Run a tool body inside its liyagent call (what `current_call` and `CallTransport` read)."""
    token = _call.set(ctx)
    try:
        yield
    finally:
        _call.reset(token)


def parse_kind(who: str, tool: str, raw: str) -> tuple[ToolKind, float | None]:
    """`read`, `write`, `approval_write` or `keyed_write:<dedupe window in seconds>`; `who`
    names the agent in the message ("pydantic-ai agent desk")."""
    name, _, window = str(raw).partition(":")
    try:
        kind = ToolKind(name.strip())
    except ValueError:
        kind = None
    if kind is None or kind not in USER_KINDS:
        raise ToolDeclarationError(
            f"{who}: tool {tool}: unknown kind {raw!r}; use read, write, "
            "approval_write or keyed_write:<dedupe window in seconds>"
        )
    if kind is ToolKind.KEYED_WRITE:
        try:
            seconds = float(window)
        except ValueError:
            seconds = 0.0
        if seconds <= 0:
            raise ToolDeclarationError(
                f"{who}: tool {tool}: a keyed write names its vendor's "
                f'dedupe window in seconds, e.g. "keyed_write:86400"'
            )
        return kind, seconds
    if window:
        raise ToolDeclarationError(
            f"{who}: tool {tool}: only a keyed write takes a window ({raw!r})"
        )
    return kind, None


def refused(who: str, feature: str, instead: str) -> ToolDeclarationError:
    """What a declaration says of a framework feature liyagent does not run: the agent (`who`),
    the feature, and what to do instead."""
    return ToolDeclarationError(f"{who}: {feature} is not supported on liyagent; {instead}")


def declared_kind(
    who: str, tool: str, declared: str | None, *, held: bool, approval: str
) -> tuple[ToolKind, float | None]:
    """A tool's kind: as declared, else a write, or an approval write when the framework holds
    the tool for a person (`held`: the framework's approval becomes liyagent's); a held tool
    declared another kind is refused, naming `approval` (how the framework said it)."""
    if declared is None:
        declared = ToolKind.APPROVAL_WRITE.value if held else ToolKind.WRITE.value
    kind, window = parse_kind(who, tool, declared)
    if held and kind is not ToolKind.APPROVAL_WRITE:
        raise ToolDeclarationError(
            f"{who}: tool {tool} {approval} but is declared {declared!r}; "
            f'declare it "approval_write" (or drop {approval})'
        )
    return kind, window


def check_named(
    who: str, tools: Collection[str], named: Mapping[str, Mapping[str, Any] | None]
) -> None:
    """Refuse a `kinds` or `readers` mapping (by its name in `named`) that names a tool the
    agent does not have: a typo would otherwise leave the real tool a write."""
    for what, mapping in named.items():
        unknown = sorted(set(mapping or {}) - set(tools))
        if unknown:
            raise ToolDeclarationError(
                f"{who}: {what} names tools the agent does not have: "
                f"{', '.join(unknown)}; its tools: {', '.join(sorted(tools)) or 'none'}"
            )


def write_reader(
    who: str, tool: str, kind: ToolKind, readers: Mapping[str, Callable[..., Any]], name: str
) -> Reader | None:
    """The reader declared for `tool` (registered as `name`), which only a write may have."""
    if tool not in readers:
        return None
    if kind not in (ToolKind.WRITE, ToolKind.APPROVAL_WRITE):
        raise ToolDeclarationError(
            f"{who}: tool {tool} is a {kind.value}; only a write (or an approval write) has a "
            "reader"
        )
    return reader_for(readers[tool], name)


class PerThread(Generic[T]):
    """One value per process and thread, made on first use: an adapter's provider holds an
    SDK client bound to the event loop its thread runs (a forked child forgets the parent's,
    runtime/base/process.py)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: process.Cache[int, T] = process.Cache("runtime.frameworks.calls", "PerThread")

    def get(self) -> T:
        return self._made.get(threading.get_ident(), self._make)


def send_refused(exc: BaseException) -> SendRefused | None:
    """The send guard's refusal under the SDK's connection error, if that is what it was."""
    seen: BaseException | None = exc
    for _ in range(20):  # a chain that loops back ends here
        if seen is None or isinstance(seen, SendRefused):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def model_error(run_id: str, exc: BaseException) -> ModelError:
    """A framework's failed model call as the engine's ModelError, by its one rule
    (`errors.classify`): an HTTP error from its status, headers and body (Retry-After and
    quota codes honoured), no response from the transport error under the SDK's, an answer cut
    off past the bound on answers as such; the run id leading the message."""
    chain = _chain(exc)
    cut = next((e for e in chain if isinstance(e, ResponseTooLarge)), None)
    if cut is not None:
        return too_large(run_id, cut)
    answered = _http_failure(chain)
    if answered is not None:
        status, headers, body = answered
        error = classify(status, headers, None, body=body)
    else:
        unanswered = _no_response(chain)
        if unanswered is not None:
            error = classify(None, None, unanswered)
        else:
            # Neither an error response nor a call left unanswered: the model answered
            # something the framework could not use (an empty or unparseable response, a body
            # the SDK could not validate, a content filter), or the framework could not make
            # the request. Not asked again, as the native providers' unusable answers are not
            # (`runtime/models/openai.py` parse_answer): the same request is likely to get the
            # same answer, and each retry would spend one of the run's attempts on it.
            # Only the error's type is said: its text may quote the answer or the prompt.
            error = ModelError(
                f"the model's answer could not be used, or the request made "
                f"({type(exc).__name__}); asking again would not help",
                retryable=False,
            )
    return ModelError(
        f"run {run_id}: {error}",
        retryable=error.retryable,
        retry_after_s=error.retry_after_s,
        rate_limited=error.rate_limited,
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """The error and those it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


def _http_failure(chain: list[BaseException]) -> tuple[int, Mapping[str, str], str] | None:
    """The status, headers and body text of the error response in the chain: the SDK's own
    response (`openai.APIStatusError.response`) first, else what the framework's error kept
    of it (Pydantic AI's `ModelHTTPError` for an error sent inside a stream)."""
    for seen in chain:
        response = getattr(seen, "response", None)
        if isinstance(response, httpx.Response | httpx2.Response) and response.is_error:
            return response.status_code, response.headers, _text(response)
    for seen in chain:
        status = getattr(seen, "status_code", None)
        if isinstance(status, int) and status >= 400:
            headers = getattr(seen, "headers", None)
            return status, headers if isinstance(headers, Mapping) else {}, _body(seen)
    return None


def _text(response: httpx.Response | httpx2.Response) -> str:
    try:
        return response.text
    except (httpx.ResponseNotRead, httpx2.ResponseNotRead):
        return ""


def _body(exc: BaseException) -> str:
    """A framework's parsed error body as the JSON text `classify` reads (the SDK keeps only
    the `error` object of `{"error": {...}}`)."""
    body = getattr(exc, "body", None)
    if body is None or isinstance(body, str):
        return body or ""
    if isinstance(body, Mapping) and "error" not in body:
        body = {"error": body}
    return json.dumps(body, default=str)


def _no_response(chain: list[BaseException]) -> Exception | None:
    """What `classify` reads of a call that got no response: the transport error under the
    SDK's (httpx2's named as httpx's, the SDK's client speaking httpx2), else the SDK's own
    timeout or connection error as a TimeoutError or ConnectionError; None for neither."""
    for seen in chain:
        if isinstance(seen, httpx.HTTPError | httpx.InvalidURL | TimeoutError | ConnectionError):
            return seen
        if isinstance(seen, httpx2.TransportError | httpx2.InvalidURL):
            return sdk_http.as_httpx_error(seen)
    for seen in chain:
        if isinstance(seen, openai.APITimeoutError):
            return TimeoutError(str(seen))
        if isinstance(seen, openai.APIConnectionError):
            return ConnectionError(str(seen))
    return None


class CallTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """An httpx transport for a team's own client (`httpx.Client(transport=CallTransport())`):
    inside a liyagent call its requests go out through the call's guarded client with the
    step key (`Idempotency-Key`) and the run's identity; outside one (the team's own tests),
    through a plain transport. The tool bodies stay as they are."""

    def __init__(self) -> None:
        self._plain = httpx.HTTPTransport()
        self._aplain = httpx.AsyncHTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        ctx = _call.get()
        if ctx is None:
            return self._plain.handle_request(request)
        sent = ctx.http.request(
            request.method, str(request.url), headers=dict(request.headers), content=request.read()
        )
        return decoded(sent)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        ctx = _call.get()
        if ctx is None:
            return await self._aplain.handle_async_request(request)
        sent = await ctx.http.arequest(
            request.method,
            str(request.url),
            headers=dict(request.headers),
            content=await request.aread(),
        )
        return decoded(sent)


# Headers that describe the body as it came over the wire: the guarded client has decoded it.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


def decoded(sent: httpx.Response) -> httpx.Response:
    """The guarded client's response for the team's client: its body already decoded, so the
    headers that say how it was encoded are left out (it would be decoded twice)."""
    headers = [(k, v) for k, v in sent.headers.multi_items() if k.lower() not in _WIRE_HEADERS]
    return httpx.Response(sent.status_code, headers=headers, content=sent.content)


# Chat-completions arguments a framework builds as plain JSON already (lists of dicts), sent as
# the request body itself instead of through the OpenAI SDK's transform.
PLAIN_ARGUMENTS = ("messages", "tools")


def plain_chat_body(client: Any) -> Any:
    """`client` (an `openai.AsyncOpenAI` of the adapter's own) with `chat.completions.create`
    sending `messages` and `tools` as the body itself. The SDK's request transform walks every
    message against the unions of its TypedDicts: 3.5 of the 5.5 ms a 12-message step cost
    through it. Its only effects on these arguments are dropping keys set to "not given" and
    listing iterables (no request type of chat messages or tools renames or formats a field),
    which `_plain` does in microseconds."""
    completions = client.chat.completions
    create: Callable[..., Awaitable[Any]] = completions.create

    async def create_plain(*args: Any, **kwargs: Any) -> Any:
        body = dict(kwargs.pop("extra_body", None) or {})
        for name in PLAIN_ARGUMENTS:
            if name in kwargs and _given(kwargs[name]):
                body[name] = _plain(kwargs.pop(name))
        kwargs.setdefault("messages", [])  # what the transform sees; the body's wins
        return await create(*args, extra_body=body, **kwargs)

    completions.create = create_plain
    return client


def _given(value: object) -> bool:
    """Not the OpenAI SDK's "not given" markers (`NOT_GIVEN`, `omit`)."""
    return type(value).__name__ not in {"NotGiven", "Omit"}


def _plain(value: object) -> object:
    """A framework's JSON-ready argument as the body carries it: "not given" keys dropped,
    tuples and other iterables of messages listed."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if _given(v)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bytes, int, float)) or value is None:
        return value
    return [_plain(v) for v in value] if hasattr(value, "__iter__") else value
