"""Loading a Compose file as Compose does, without a Docker engine: YAML 1.2 scalars, merge
keys, duplicate keys rejected, and ``${VAR}`` interpolation with harmless placeholders (never
this process's environment). Used by ``validate.py`` beside it."""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml

#: What a variable without a default stands for while validating.
PLACEHOLDER = "placeholder"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


class ComposeError(Exception):
    """A problem that stops validation of the file (unreadable, not YAML, bad template)."""


class ComposeLoader(yaml.SafeLoader):
    """A SafeLoader that reads scalars as YAML 1.2 (core schema), as Compose's Go loader does.

    PyYAML implements YAML 1.1, where ``no``/``on`` are booleans and ``55:55`` is a base-60
    integer; Compose sees strings there. Duplicate keys are errors, as they are for Compose.
    """

    # Start from no resolvers at all; the YAML 1.2 core ones are added below.
    yaml_implicit_resolvers: ClassVar[dict[str | None, list[tuple[str, re.Pattern[str]]]]] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """Build a mapping, rejecting a key given twice (merge keys excepted)."""
        seen: set[Hashable] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable):
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key!r}",
                        key_node.start_mark,
                    )
                seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body.startswith("0o"):
        return sign * int(body[2:], 8)
    if body.startswith("0x"):
        return sign * int(body[2:], 16)
    return sign * int(body, 10)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


ComposeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
ComposeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"),
)
ComposeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)
ComposeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
)
ComposeLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^<<$"), ["<"])
ComposeLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
ComposeLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


def load_compose(path: Path) -> Any:
    """Parse a Compose file as Compose would, before interpolation."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ComposeError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=ComposeLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ComposeError(f"{path}: not valid YAML: {exc}") from None


# --------------------------------------------------------------------------- interpolation


def interpolate(text: str, names: set[str] | None = None) -> str:
    """Interpolate one string the way Compose does, with every variable unset.

    ``$$`` is a literal ``$``; ``${VAR:-x}`` and ``${VAR-x}`` give ``x`` (itself interpolated);
    ``${VAR:+x}`` and ``${VAR+x}`` give ``""``; ``${VAR}``, ``$VAR``, ``${VAR:?msg}`` and
    ``${VAR?msg}`` give PLACEHOLDER, standing for the value the user must provide. Every
    variable name met is added to ``names``. A malformed template raises ComposeError.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$":
            out.append(char)
            i += 1
            continue
        following = text[i + 1 : i + 2]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "{":
            end = _closing_brace(text, i + 2)
            out.append(_braced(text[i + 2 : end], names))
            i = end + 1
        elif match := _NAME.match(text, i + 1):
            if names is not None:
                names.add(match.group())
            out.append(PLACEHOLDER)
            i = match.end()
        else:
            raise ComposeError(
                f"invalid interpolation in {text!r}: a '$' must start $VAR or ${{VAR}}; "
                "write '$$' for a literal '$'"
            )
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    raise ComposeError(f"invalid interpolation in {text!r}: '${{' without a closing '}}'")


def _braced(body: str, names: set[str] | None) -> str:
    match = _NAME.match(body)
    if not match:
        raise ComposeError(f"invalid interpolation ${{{body}}}: not a variable name")
    if names is not None:
        names.add(match.group())
    rest = body[match.end() :]
    if not rest:
        return PLACEHOLDER
    for operator in _OPERATORS:
        if rest.startswith(operator):
            argument = interpolate(rest[len(operator) :], names)
            if operator.endswith("-"):
                return argument
            if operator.endswith("?"):
                return PLACEHOLDER
            return ""
    raise ComposeError(
        f"invalid interpolation ${{{body}}}: use one of "
        + ", ".join(f"${{VAR{op}...}}" for op in _OPERATORS)
    )


def interpolate_tree(node: Any, names: set[str] | None = None, where: str = "") -> Any:
    """Interpolate every string value of a loaded Compose document (keys are left alone)."""
    try:
        if isinstance(node, str):
            return interpolate(node, names)
    except ComposeError as exc:
        raise ComposeError(f"{where or '<root>'}: {exc}") from None
    if isinstance(node, Mapping):
        return {
            key: interpolate_tree(value, names, _join(where, key)) for key, value in node.items()
        }
    if isinstance(node, list):
        return [interpolate_tree(value, names, _join(where, i)) for i, value in enumerate(node)]
    return node


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


# --------------------------------------------------------------------------- schema
