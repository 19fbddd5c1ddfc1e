"""Background job kinds declared like tools: a function, its typed parameters, whether it resumes.

    class Params(JobParams):
        source: str
        page_size: int = 10

    @job(kind="acme.sync", resumable=True)
    def sync(ctx: JobContext, params: Params) -> str:
        page = ctx.cursor.get("page", 0)
        ...
        ctx.cursor["page"] = page + 1
        ctx.checkpoint()  # a resumed job continues from here, not from the start

The parameters model (the function's second parameter's type, a `JobParams`) checks a job's
parameters when it is queued (bad ones store nothing) and again when it runs. Declarations are
found in the modules `LIYAGENT_TOOLS` names, as tools are, and in `LIYAGENT_JOB_MODULES` (the
built-in kinds); the engine (runtime/core/jobs.py) drives them, fenced and checkpointed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.base.validation import described
from store.errors import LiyagentError


class JobDeclarationError(LiyagentError, ValueError):
    """A job kind is declared wrong (no parameters model, a bad name); processes refuse to
    start with it, naming the module."""


class JobError(LiyagentError, ValueError):
    """The job's parameters or source are unusable; the job fails with this reason (or, for
    parameters checked at enqueue, is never stored)."""


class JobParams(BaseModel):
    """A job kind's parameters: unknown ones are refused, so a typo is caught at enqueue."""

    model_config = ConfigDict(extra="forbid")


class JobContext(Protocol):
    """What a job's function is handed: its run, its cursor and the engine's durable steps."""

    @property
    def run_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def cursor(self) -> dict[str, Any]:
        """The job's durable position (JSON values): restored from the last checkpoint on a
        resume; change it, then `checkpoint()`."""
        ...

    def checkpoint(self) -> None:
        """Write the cursor (and counters) durably after a unit of work, fenced: a job lost
        after this continues from here on any worker."""
        ...

    def boundary(self) -> None:
        """Between units of work: still ours, not draining, not stopped (raises otherwise)."""
        ...

    def call(self, call_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """Make one tool call through the runs' checkpoint-mark-send-record path (keyed by the
        job's step); a call a lost attempt left is settled, not blindly made again."""
        ...

    def count(self, name: str, n: int = 1) -> None: ...

    def count_of(self, name: str) -> int: ...

    def wait(self, seconds: float) -> NoReturn:
        """Checkpointed already, wait `seconds` holding no worker, then run again from the
        cursor (a poll on a timer)."""
        ...

    @property
    def services(self) -> Any:
        """The process's services (its database engine, settings, sealer)."""
        ...


JobFn = Callable[[JobContext, Any], Any]


@dataclass(frozen=True)
class JobKind:
    """One declared job kind: its name, whether a lost attempt resumes, how it runs, what
    parameters it takes and the tools its runs may call (and only those)."""

    name: str
    resumable: bool
    run: JobFn
    params: type[JobParams]
    tools: tuple[str, ...] = ()
    origin: str = "python"

    def check(self, params: dict[str, Any], settings: Any = None) -> JobParams:
        """The parameters as this kind takes them; JobError naming each field that is wrong.
        `settings`, the deployment's, are handed to its validators as the validation context
        (`info.context["settings"]`: what a parameter may name, e.g. LIYAGENT_SOURCE_ROOTS)."""
        context = {"settings": settings} if settings is not None else None
        try:
            return self.params.model_validate(params, context=context)
        except ValidationError as exc:
            raise JobError(f"bad parameters ({described(exc, 'params')})") from None

    def __call__(self, ctx: JobContext, params: Any) -> Any:
        """Still callable as the plain function (for a team's own tests)."""
        return self.run(ctx, params)


def job(
    *, kind: str, resumable: bool = False, tools: Iterable[str] = ()
) -> Callable[[JobFn], JobKind]:
    """Declare a job kind: `fn(ctx: JobContext, params: P) -> str | JSON value`, `P` a
    `JobParams` model. A resumable kind continues from its checkpointed cursor after a lost
    worker; any other fails `interrupted` and must be started again."""
    if not kind.strip() or kind != kind.strip():
        raise JobDeclarationError(f"job kind {kind!r}: a kind is a non-empty name")

    def declare(fn: JobFn) -> JobKind:
        return JobKind(kind, resumable, fn, _params_model(fn, kind), tuple(tools))

    return declare


def _params_model(fn: JobFn, kind: str) -> type[JobParams]:
    """The model the function's second parameter is annotated with (its parameters)."""
    params = list(inspect.signature(fn).parameters)
    try:
        hints = get_type_hints(fn)
    except Exception as exc:
        raise JobDeclarationError(f"job {kind}: its type hints cannot be read ({exc})") from exc
    model = hints.get(params[1]) if len(params) == 2 else None
    if not (isinstance(model, type) and issubclass(model, JobParams)):
        raise JobDeclarationError(
            f"job {kind}: declare it as fn(ctx: JobContext, params: P) with P a JobParams "
            "model (its parameters, checked when the job is queued)"
        )
    return model
