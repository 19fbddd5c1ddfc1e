"""A run's pin: what of the deployment's code its definition was started against, so that a
worker running other code (a rolling deploy) never continues it silently on something else.

The definition (runtime/durable/definition.py) already seals what a run is given: its model
spec, its tools by name, its system prompt, its output schema. The pin adds what the code says
of those names when the run starts: each tool's kind and a digest of its argument schema, the
output type the code declares for the agent (a framework agent's own, checked by its
provider), and the agent's instructions as the code gives them (a framework agent's, which its
provider sends with each request; a native agent's declared prompt, when the run started with
it). The instructions are kept as text: a run is asked with its pinned ones on any worker, so a
changed prompt is never mixed into a run (a pinned run keeps its own to the end). A tool whose
body changed but whose name, kind and schema did not is served as it is now (the pin says
nothing of bodies). The pin is sealed like the definition (purpose `pin`), in a column of its
own, so a worker of before pins reads its runs as it always did.

`drift` compares a pin with the code this worker runs; what to do about it is the agent's
policy (`Policy`) and runtime/core/drift.py's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from weakref import WeakKeyDictionary

from runtime.base.sealing import Sealer, SealError
from runtime.durable import formats
from runtime.durable.formats import NewerFormat
from runtime.durable.policy import Instructions, Policy

PURPOSE = "pin"
# What a pinned run is served through: asked with its pinned text, whatever the code says now.
SERVED_AS_PINNED = frozenset({"instructions", "model"})


class Declared(Protocol):
    """What the code a process runs declares (runtime/toolbox/tools.py `ToolRegistry`)."""

    def declared_tool(self, name: str) -> tuple[str, dict[str, Any]] | None:
        """A tool's kind and argument schema, None when the code has no such tool."""
        ...

    def declared_output(self, agent: str) -> dict[str, Any] | None:
        """The JSON schema of the output type the code declares for an agent (None: text)."""
        ...

    def declared_instructions(self, agent: str) -> Instructions | None:
        """The instructions the code gives an agent, None when it declares none."""
        ...

    def declared_names(self) -> tuple[list[str], list[str]]:
        """The names of every tool and every agent the code declares."""
        ...

    def declared_model(self, agent: str) -> str | None:
        """The model a framework agent's code asks (None: no such agent, or it names none)."""
        ...


@dataclass(frozen=True)
class PinnedModel:
    """The model a run asked when it started, where its spec leaves it to the deployment:
    its profile's default (`served`: a worker asks this one whatever the profile says now),
    or a framework agent's code model (a worker whose code asks another cannot serve it)."""

    name: str
    served: bool


# Each code's version, computed once (its declarations are read when it is loaded, not after).
_VERSIONS: WeakKeyDictionary[Any, str] = WeakKeyDictionary()


def code_version(code: Declared) -> str:
    """Names what `code` declares as a whole (every tool's kind and argument schema, every
    agent's output type and instructions): the version a run's pin names, which the fleet
    orders by when it first saw it (store/pins.py `code_versions`)."""
    found = _VERSIONS.get(code)
    if found is None:
        tools, agents = code.declared_names()
        said = {
            "tools": Pin.of(code, "", tools).to_json()["tools"],
            "agents": {
                name: [
                    code.declared_output(name),
                    code.declared_instructions(name),
                    code.declared_model(name),
                ]
                for name in agents
            },
        }
        found = _VERSIONS[code] = digest(said)
    return found


def digest(value: Any) -> str:
    """A short, stable digest of a JSON value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# What a schema says for people, not for the arguments it accepts: a reworded docstring is
# not a changed tool.
PROSE = frozenset({"description", "title", "examples"})


def structural(schema: Any) -> Any:
    """A JSON schema without its prose (`PROSE`, at every depth): what the arguments are.
    A property named like a prose key is kept (under `properties` every key is a name)."""
    if isinstance(schema, list):
        return [structural(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: (
            {name: structural(sub) for name, sub in value.items()}
            if key == "properties" and isinstance(value, dict)
            else structural(value)
        )
        for key, value in schema.items()
        if key not in PROSE
    }


@dataclass(frozen=True)
class ToolPin:
    """One tool as the code declared it when the run started."""

    kind: str
    schema: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "schema": self.schema}


@dataclass(frozen=True)
class Drift:
    """One way the code a worker runs differs from a run's pin: `what` is `tool`, `output` or
    `agent`; `change` is `gone`, `kind` or `schema` (for a tool), `type` (its output) or
    `instructions` (the agent's: a pinned run is served through it, by its pinned text)."""

    what: str
    name: str
    change: str
    was: str | None
    now: str | None

    def to_json(self) -> dict[str, str | None]:
        return {
            "what": self.what,
            "name": self.name,
            "change": self.change,
            "was": self.was,
            "now": self.now,
        }

    def say(self) -> str:
        """One line for an operator: what changed, from what to what."""
        if self.change == "gone":
            return f"{self.what} {self.name} is gone"
        if self.change == "format":
            return f"its {self.name} is of format {self.now}, newer than this worker reads"
        return f"{self.what} {self.name}: its {self.change} changed ({self.was} -> {self.now})"


@dataclass(frozen=True)
class Pin:
    """What a run was started against (see the module docstring)."""

    policy: Policy = Policy.PINNED
    tools: dict[str, ToolPin] = field(default_factory=dict)
    # The digest of the output type the code declared for the agent (None: text).
    output: str | None = None
    # The agent's instructions as the code gave them (None: the code gives it none, or the
    # run started with a prompt of its caller's own, which no code changes).
    instructions: Instructions | None = None
    # The version of the code that pinned it (`code_version`; None: a pin of before versions).
    code: str | None = None
    # The model it asked when it started, where its spec leaves it to the deployment.
    model: PinnedModel | None = None

    @classmethod
    def of(
        cls,
        code: Declared,
        agent: str,
        tools: list[str],
        policy: Policy = Policy.PINNED,
        system: str | None = None,
        model: PinnedModel | None = None,
        version: str | None = None,
    ) -> Pin:
        """The pin of a run of `agent` given `tools`, started with system prompt `system` and
        asking `model` (runtime/core/code_versions.py `pinned_model`), against this code (its
        deployment's `version`: `deployment_version` there; the code's own when none)."""
        pinned = {}
        for name in tools:
            declared = code.declared_tool(name)
            if declared is not None:
                pinned[name] = ToolPin(declared[0], digest(structural(declared[1])))
        output = code.declared_output(agent)
        said = code.declared_instructions(agent)
        own = said is not None and (said.per_request or said.text == system)
        return cls(
            policy,
            pinned,
            None if output is None else digest(output),
            said if own else None,
            version if version is not None else code_version(code) if agent else None,
            model,
        )

    def latest(
        self,
        code: Declared,
        agent: str,
        tools: list[str],
        model: PinnedModel | None = None,
        version: str | None = None,
    ) -> Pin:
        """The pin a run that follows the latest definition takes from this code and its
        deployment (of `version`, asking `model` now): its tools' kinds and schemas, its output
        type, and its instructions and model where it was pinned to the code's (a run started
        with its caller's own prompt or model keeps them)."""
        now = Pin.of(code, agent, tools, self.policy, version=version)
        said = code.declared_instructions(agent)
        instructions = said if self.instructions is not None else None
        asked = model if self.model is not None else None
        return Pin(self.policy, now.tools, now.output, instructions, now.code, asked)

    @property
    def id(self) -> str:
        """Names this definition version (`deploy status`, `waiting_on`): what the run is
        pinned to, whichever code version pinned it."""
        return digest({k: v for k, v in self.to_json().items() if k != "code"})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.policy.value,
            "tools": {name: pin.to_json() for name, pin in sorted(self.tools.items())},
            "output": self.output,
        }
        if self.instructions is not None:
            out["instructions"] = self.instructions.text
            out["per_request"] = self.instructions.per_request
        if self.code is not None:
            out["code"] = self.code
        if self.model is not None:
            out["model"] = {"name": self.model.name, "served": self.model.served}
        return out

    def drift(self, code: Declared, agent: str, model: PinnedModel | None = None) -> list[Drift]:
        """How the code (and its deployment, which asks `model` now) differs from this pin
        (empty: it serves the run as pinned)."""
        now = Pin.of(code, agent, list(self.tools), self.policy)
        found = []
        for name, was in sorted(self.tools.items()):
            current = now.tools.get(name)
            if current is None:
                found.append(Drift("tool", name, "gone", was.kind, None))
            elif current.kind != was.kind:
                found.append(Drift("tool", name, "kind", was.kind, current.kind))
            elif current.schema != was.schema:
                found.append(Drift("tool", name, "schema", was.schema, current.schema))
        # A run started where the code declared no output type for its agent (a text agent,
        # or a schema of the caller's own) is not judged by what another code declares.
        if self.output is not None and now.output != self.output:
            found.append(Drift("output", agent, "type", self.output, now.output))
        if self.instructions is not None:
            said = code.declared_instructions(agent)
            text = None if said is None else said.text
            if text != self.instructions.text:
                new = None if text is None else digest(text)
                found.append(
                    Drift("agent", agent, "instructions", digest(self.instructions.text), new)
                )
        now_model = None if model is None else model.name
        if self.model is not None and now_model != self.model.name:
            change = "model" if self.model.served else "framework model"
            found.append(Drift("agent", agent, change, self.model.name, now_model))
        return found

    def asked(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The model spec a run asks with under this pin: its own, naming the model it pinned
        where it names none (its profile's default then; whatever that default is now)."""
        if self.model is None or not self.model.served or "model" in spec:
            return spec
        return {**spec, "model": self.model.name}

    def offered(self, tools: list[str]) -> list[str]:
        """Of the tools a run was given, those it may use under this pin: the pinned ones (a
        tool a follower's re-pin dropped is never offered again)."""
        return [name for name in tools if name in self.tools]

    def unserved(self, code: Declared, agent: str, model: PinnedModel | None = None) -> list[Drift]:
        """What keeps the code from serving the run as its policy says (empty: it does): a
        pinned run is served through changed instructions and a profile's changed default
        model (asked with its pinned ones), one that follows the latest through nothing."""
        found = self.drift(code, agent, model)
        if self.policy is Policy.PINNED:
            return [change for change in found if change.change not in SERVED_AS_PINNED]
        return found

    def seal(self, sealer: Sealer, run_id: str) -> bytes:
        # A pin without instructions or a model is written as format 1, so a worker of before
        # format 2 reads it (a rolling deploy; its `code` it ignores).
        newer = self.instructions is not None or self.model is not None
        format = formats.PIN.writes if newer else 1
        return sealer.seal(run_id, PURPOSE, 0, {"format": format, **self.to_json()})

    @classmethod
    def open(cls, sealer: Sealer, run_id: str, sealed: bytes) -> Pin:
        """The run's pin, verified against its seal; SealError when it does not verify.
        `NewerFormat` when it is of a format this worker does not read."""
        payload = sealer.open(run_id, PURPOSE, 0, sealed)
        if not isinstance(payload, Mapping):
            raise SealError(run_id, PURPOSE, "its payload is not a pin")
        try:
            formats.PIN.check(run_id, payload.get("format"))
            tools = {
                str(name): ToolPin(str(t["kind"]), str(t["schema"]))
                for name, t in dict(payload["tools"]).items()
            }
            text = payload.get("instructions")
            said = None
            if text is not None:
                said = Instructions(str(text), bool(payload.get("per_request")))
            code, asked = payload.get("code"), payload.get("model")
            model = None
            if asked is not None:
                model = PinnedModel(str(asked["name"]), bool(asked["served"]))
            return cls(
                Policy(payload["policy"]),
                tools,
                payload.get("output"),
                said,
                None if code is None else str(code),
                model,
            )
        except (KeyError, TypeError, ValueError):
            raise SealError(run_id, PURPOSE, "its fields are not a pin") from None


__all__ = [
    "Declared",
    "Drift",
    "Instructions",
    "NewerFormat",
    "Pin",
    "PinnedModel",
    "Policy",
    "ToolPin",
    "code_version",
    "digest",
    "structural",
]
