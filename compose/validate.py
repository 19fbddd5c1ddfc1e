#!/usr/bin/env python3
"""Validate the liyagent Compose file without a Docker engine.

Usage: ``python compose/validate.py [compose/compose.yaml]``

The file is loaded the way Compose loads it (YAML 1.2 scalars, merge keys, duplicate keys
rejected), ``${VAR}`` / ``${VAR:-default}`` / ``${VAR:?message}`` and friends are interpolated
with harmless placeholder values (never from this process's environment, so the result does
not depend on who runs it), the result is checked against the Compose Specification JSON
schema in ``compose-spec.json`` beside this script, and then against the project's rules:

* every service built from the project runs the one image built from ``compose/Dockerfile``,
  whose final ``USER`` is not root and which installs the project with every extra;
* ``worker`` can be scaled: no ``container_name``, no ``hostname``, no fixed published port;
* ``flower`` is published on loopback only and ``FLOWER_BASIC_AUTH`` is required;
* ``LIYAGENT_SEAL_KEYS`` is required wherever it is set, never written in the file;
* ``app`` gets ``LIYAGENT_FRONT_TOKEN``, required the same way (without one the front answers
  503 to every request);
* no obsolete top-level ``version`` key;
* every variable the file uses is documented in ``.env.example`` beside it.

Prints ``compose OK`` and exits 0, or prints each error and exits 1.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema.exceptions
from compose_yaml import ComposeError, interpolate_tree, load_compose

HERE = Path(__file__).resolve().parent
SCHEMA_PATH = HERE / "compose-spec.json"
DEFAULT_COMPOSE = HERE / "compose.yaml"

SCALABLE_SERVICE = "worker"
FLOWER_SERVICE = "flower"
APP_SERVICE = "app"
REQUIRED_VARIABLES = {
    # variable: services that must set it from a required `${VAR:?...}` (None: wherever set)
    "FLOWER_BASIC_AUTH": (FLOWER_SERVICE,),
    "LIYAGENT_SEAL_KEYS": None,
    # Without a token the front answers 503 to every request.
    "LIYAGENT_FRONT_TOKEN": (APP_SERVICE,),
}


def load_schema(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """The committed Compose Specification schema."""
    try:
        schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ComposeError(f"{path}: cannot load the Compose schema: {exc}") from None
    return schema


def schema_errors(document: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every violation of the Compose Specification, most specific cause first."""
    validator_class = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft7Validator
    )
    validator = validator_class(schema)
    found: list[str] = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path))):
        cause = _deepest_cause(error)
        where = ".".join(map(str, cause.absolute_path)) or "<root>"
        found.append(f"schema: {where}: {cause.message}")
    return found


def _deepest_cause(error: jsonschema.exceptions.ValidationError) -> Any:
    """For a oneOf/anyOf failure, the sub-error deepest in the document, if deeper than it.

    `depends_on: {migrate: {condition: done}}` then reads "...condition: 'done' is not one of"
    rather than "is not of type 'array'" from the list branch of the oneOf.
    """
    leaves: list[jsonschema.exceptions.ValidationError] = []
    pending = list(error.context or ())
    while pending:
        sub = pending.pop()
        if sub.context:
            pending.extend(sub.context)
        else:
            leaves.append(sub)
    if not leaves:
        return error
    deepest = max(leaves, key=lambda sub: len(sub.absolute_path))
    return deepest if len(deepest.absolute_path) > len(error.absolute_path) else error


# --------------------------------------------------------------------------- project rules


def project_errors(raw: Mapping[str, Any], document: Mapping[str, Any], compose: Path) -> list[str]:
    """The project's own rules, on the raw and the interpolated document."""
    found: list[str] = []
    if "version" in raw:
        found.append("version: the top-level `version` key is obsolete in Compose; remove it")
    services = document.get("services")
    raw_services = raw.get("services")
    if not isinstance(services, Mapping) or not isinstance(raw_services, Mapping):
        found.append("services: missing, or not a mapping of services")
        return found
    found += _image_errors(services, compose.parent)
    found += _scaling_errors(services)
    found += _flower_errors(services)
    found += _required_variable_errors(raw_services)
    return found


def _services(services: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for name, service in services.items():
        if isinstance(service, Mapping):
            yield str(name), service


def _image_errors(services: Mapping[str, Any], compose_dir: Path) -> list[str]:
    dockerfile = (compose_dir / "Dockerfile").resolve()
    found: list[str] = []
    built_images: set[str] = set()
    for name, service in _services(services):
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        if not isinstance(build, Mapping):
            continue  # the schema reports it
        if "dockerfile_inline" in build:
            found.append(f"services.{name}.build: use compose/Dockerfile, not dockerfile_inline")
            continue
        context = str(build.get("context", "."))
        if "://" in context or context.startswith("git@"):
            found.append(f"services.{name}.build.context: build from the repository, not {context}")
            continue
        target = (compose_dir / context / str(build.get("dockerfile", "Dockerfile"))).resolve()
        if target != dockerfile:
            found.append(
                f"services.{name}.build: builds {_shown(target, compose_dir)}, "
                f"not the project's {_shown(dockerfile, compose_dir)}"
            )
        image = service.get("image")
        if image is None or image == "":
            found.append(f"services.{name}: a service that builds must name its `image`")
        elif isinstance(image, str):  # any other type: the schema reports it
            built_images.add(image)
    if not built_images:
        found.append(
            f"services: no service builds the project image from {_shown(dockerfile, compose_dir)}"
        )
        return found
    if len(built_images) > 1:
        found.append(
            "services: services built from compose/Dockerfile must share one image name, got "
            + ", ".join(sorted(built_images))
        )
    repositories = {_repository(image) for image in built_images}
    for name, service in _services(services):
        image = service.get("image")
        if "build" in service or not isinstance(image, str):
            continue
        if image not in built_images and _repository(image) in repositories:
            found.append(
                f"services.{name}.image: {image} is not the project image "
                f"({', '.join(sorted(built_images))}) built from compose/Dockerfile"
            )
    found += _dockerfile_errors(dockerfile)
    return found


def _shown(path: Path, compose_dir: Path) -> str:
    """A path as seen from the repository root (the compose directory's parent)."""
    try:
        return path.relative_to(compose_dir.resolve().parent).as_posix()
    except ValueError:
        return str(path)


def _repository(image: str) -> str:
    """The image reference without its tag or digest."""
    name = image.split("@", 1)[0]
    head, sep, tag = name.rpartition(":")
    return head if sep and "/" not in tag else name


def _dockerfile_errors(dockerfile: Path) -> list[str]:
    try:
        text = dockerfile.read_text(encoding="utf-8")
    except OSError:
        return [f"{dockerfile}: missing; every liyagent service builds from it"]
    users = re.findall(r"^\s*USER\s+(\S+)", text, flags=re.MULTILINE | re.IGNORECASE)
    if not users or users[-1].split(":", 1)[0] in {"root", "0"}:
        return [f"{dockerfile}: the image must end with a non-root `USER`"]
    if not re.search(r"^\s*RUN\s+pip install\s+[\"']?\.\[all\]", text, flags=re.MULTILINE):
        # `pip install .` is the core alone: no front, Teams, A2A, Flower or simulators.
        return [f"{dockerfile}: the image must install the project with every extra (`.[all]`)"]
    return []


def _published(port: Any) -> list[tuple[str, str]]:
    """(host_ip, host_port) of one `ports` entry; empty strings where Docker chooses."""
    if isinstance(port, Mapping):
        return [(str(port.get("host_ip") or ""), str(port.get("published") or ""))]
    if isinstance(port, int):
        return [("", "")]
    if not isinstance(port, str):
        return []
    spec = port.split("/", 1)[0]
    host_ip = ""
    if spec.startswith("["):
        host_ip, _, spec = spec[1:].partition("]")
        spec = spec.removeprefix(":")
        return [(host_ip, spec.rpartition(":")[0])]
    parts = spec.split(":")
    if len(parts) == 1:
        return [("", "")]
    if len(parts) == 2:
        return [("", parts[0])]
    return [(":".join(parts[:-2]), parts[-2])]


def _scaling_errors(services: Mapping[str, Any]) -> list[str]:
    worker = services.get(SCALABLE_SERVICE)
    if not isinstance(worker, Mapping):
        return [f"services.{SCALABLE_SERVICE}: missing, or not a mapping"]
    where = f"services.{SCALABLE_SERVICE}"
    found = [
        f"{where}.{key}: a fixed {key} breaks `--scale {SCALABLE_SERVICE}=N`; remove it"
        for key in ("container_name", "hostname")
        if key in worker
    ]
    for port in worker.get("ports") or []:
        for _, host_port in _published(port):
            if host_port:
                found.append(
                    f"{where}.ports: {port!r} publishes fixed host port {host_port}, "
                    f"which breaks `--scale {SCALABLE_SERVICE}=N`"
                )
    return found


def _is_loopback(host_ip: str) -> bool:
    try:
        return ipaddress.ip_address(host_ip).is_loopback
    except ValueError:
        return False


def _flower_errors(services: Mapping[str, Any]) -> list[str]:
    flower = services.get(FLOWER_SERVICE)
    if not isinstance(flower, Mapping):
        return [f"services.{FLOWER_SERVICE}: missing, or not a mapping"]
    where = f"services.{FLOWER_SERVICE}"
    found: list[str] = []
    if flower.get("network_mode") == "host":
        found.append(f"{where}.network_mode: host would expose Flower on every interface")
    for port in flower.get("ports") or []:
        for host_ip, _ in _published(port):
            if not _is_loopback(host_ip):
                found.append(
                    f"{where}.ports: {port!r} is not bound to 127.0.0.1; Flower's /metrics and "
                    "/healthcheck answer without auth, so publish it on loopback only"
                )
    command = flower.get("command")
    words = command if isinstance(command, list) else str(command or "").split()
    if any(re.match(r"--basic[-_]auth", str(word)) for word in words):
        found.append(f"{where}.command: take basic auth from FLOWER_BASIC_AUTH, not the command")
    return found


def _environment(service: Mapping[str, Any]) -> dict[str, Any]:
    env = service.get("environment")
    if isinstance(env, Mapping):
        return {str(key): value for key, value in env.items()}
    if isinstance(env, list):
        return dict(str(item).partition("=")[::2] for item in env)
    return {}


def _required_variable_errors(raw_services: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    for variable, owners in REQUIRED_VARIABLES.items():
        required = re.compile(rf"^\$\{{{variable}:?\?[^}}]*\}}$")
        for name in owners or ():
            service = raw_services.get(name)
            if isinstance(service, Mapping) and variable not in _environment(service):
                found.append(f"services.{name}.environment: {variable} must be set")
        for name, service in _services(raw_services):
            env = _environment(service)
            if variable in env and not required.match(str(env[variable] or "")):
                found.append(
                    f"services.{name}.environment.{variable}: must be required from the "
                    f"environment as ${{{variable}:?message}}, never written in the file"
                )
    return found


def env_example_errors(names: Iterable[str], example: Path) -> list[str]:
    """Variables that the Compose file uses but ``.env.example`` does not document."""
    if not example.exists():
        return []
    text = example.read_text(encoding="utf-8")
    return [
        f"{example.name}: {name} is used by the Compose file but not documented"
        for name in sorted(set(names))
        if not re.search(rf"^\s*#?\s*{re.escape(name)}=", text, flags=re.MULTILINE)
    ]


# --------------------------------------------------------------------------- entry points


def validate(compose: Path, schema_path: Path = SCHEMA_PATH) -> list[str]:
    """Every problem found in a Compose file; an empty list means it is valid."""
    try:
        raw = load_compose(compose)
        if not isinstance(raw, Mapping):
            return [f"{compose}: a Compose file is a mapping at the top level"]
        names: set[str] = set()
        document = interpolate_tree(raw, names)
        schema = load_schema(schema_path)
    except ComposeError as exc:
        return [str(exc)]
    found = schema_errors(document, schema)
    found += project_errors(raw, document, compose)
    found += env_example_errors(names, compose.parent / ".env.example")
    return found


def main(argv: list[str] | None = None) -> int:
    """Command line: validate one Compose file, print the verdict, return the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) > 1 or any(arg in {"-h", "--help"} for arg in args):
        print(__doc__)
        return 0 if args and args[0] in {"-h", "--help"} else 2
    compose = Path(args[0]) if args else DEFAULT_COMPOSE
    found = validate(compose)
    if found:
        for problem in found:
            print(problem, file=sys.stderr)
        print(f"compose: {len(found)} error(s) in {compose}", file=sys.stderr)
        return 1
    print("compose OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
