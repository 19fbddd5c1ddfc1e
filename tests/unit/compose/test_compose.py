"""compose/validate.py accepts the real Compose file and rejects broken copies of it.

Self-contained on purpose: it imports nothing from the project's packages, only the validator
script (loaded from its path) and runs it as `python compose/validate.py` would be run in CI.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_DIR = ROOT / "compose"
VALIDATOR = COMPOSE_DIR / "validate.py"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"


def _load_validator() -> ModuleType:
    # As `python compose/validate.py` runs it: its directory first on the path (the loader
    # beside it, compose_yaml.py).
    if str(COMPOSE_DIR) not in sys.path:
        sys.path.insert(0, str(COMPOSE_DIR))
    spec = importlib.util.spec_from_file_location("compose_validate", VALIDATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


validate_module = _load_validator()
compose_yaml = importlib.import_module("compose_yaml")  # the loader validate.py imports


def run_validator(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the validator as CI does, from the repository root."""
    return subprocess.run(
        [sys.executable, str(VALIDATOR), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def mutated_copy(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of compose/ in tmp_path whose compose.yaml went through `mutate`.

    The copy keeps the layout (tmp_path/compose/compose.yaml, Dockerfile, .env.example), so
    `context: ..` + `dockerfile: compose/Dockerfile` still resolve to the copied Dockerfile.
    """
    target = tmp_path / "compose"
    target.mkdir()
    for name in ("Dockerfile", ".env.example"):
        shutil.copy(COMPOSE_DIR / name, target / name)
    document = compose_yaml.load_compose(COMPOSE_FILE)
    mutate(document)
    path = target / "compose.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_real_compose_file_is_valid() -> None:
    result = run_validator(str(COMPOSE_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "compose OK"


def test_default_path_is_the_real_compose_file() -> None:
    result = run_validator()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compose OK" in result.stdout


def test_unchanged_copy_is_valid(tmp_path: Path) -> None:
    """The round trip used by the failing cases below does not break the file by itself."""
    result = run_validator(str(mutated_copy(tmp_path, lambda doc: None)))
    assert result.returncode == 0, result.stdout + result.stderr


def _set(service: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["services"][service][key] = value

    return mutate


def _rename_services(doc: dict[str, Any]) -> None:
    doc["servces"] = doc.pop("services")


def _flower_auth(value: str | None) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        env = dict(doc["services"]["flower"]["environment"])
        if value is None:
            del env["FLOWER_BASIC_AUTH"]
        else:
            env["FLOWER_BASIC_AUTH"] = value
        doc["services"]["flower"]["environment"] = env

    return mutate


def _obsolete_version(doc: dict[str, Any]) -> None:
    doc["version"] = "3.8"


def _literal_seal_keys(doc: dict[str, Any]) -> None:
    env = dict(doc["services"]["worker"]["environment"])
    env["LIYAGENT_SEAL_KEYS"] = "k1:" + "A" * 43 + "="
    doc["services"]["worker"]["environment"] = env


def _front_token(value: str | None) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        env = dict(doc["services"]["app"]["environment"])
        if value is None:
            del env["LIYAGENT_FRONT_TOKEN"]
        else:
            env["LIYAGENT_FRONT_TOKEN"] = value
        doc["services"]["app"]["environment"] = env

    return mutate


def _other_dockerfile(doc: dict[str, Any]) -> None:
    doc["services"]["beat"]["build"] = {"context": "..", "dockerfile": "Dockerfile"}


def _undocumented_variable(doc: dict[str, Any]) -> None:
    doc["services"]["redis"]["image"] = "redis:${REDIS_TAG:-7}"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        pytest.param(
            _set("worker", "container_name", "liyagent-worker"),
            "container_name",
            id="worker-container-name",
        ),
        pytest.param(_set("worker", "hostname", "worker"), "hostname", id="worker-hostname"),
        pytest.param(
            _set("worker", "ports", ["9000:9000"]), "fixed host port", id="worker-fixed-port"
        ),
        pytest.param(
            _set("flower", "ports", ["0.0.0.0:5555:5555"]), "127.0.0.1", id="flower-0.0.0.0"
        ),
        pytest.param(
            _set("flower", "ports", ["5555:5555"]), "127.0.0.1", id="flower-all-interfaces"
        ),
        pytest.param(
            _set("flower", "ports", [{"target": 5555, "published": "5555"}]),
            "127.0.0.1",
            id="flower-long-syntax",
        ),
        pytest.param(_flower_auth(None), "FLOWER_BASIC_AUTH", id="flower-auth-missing"),
        pytest.param(_flower_auth("admin:admin"), "FLOWER_BASIC_AUTH", id="flower-auth-literal"),
        pytest.param(
            _flower_auth("${FLOWER_BASIC_AUTH:-admin:admin}"),
            "FLOWER_BASIC_AUTH",
            id="flower-auth-default",
        ),
        pytest.param(_rename_services, "schema: <root>: 'servces'", id="servces-typo"),
        pytest.param(
            _set("app", "image", [123]), "schema: services.app.image", id="image-is-a-list"
        ),
        pytest.param(
            _set("app", "imagee", "liyagent:local"),
            "schema: services.app: 'imagee'",
            id="unknown-service-key",
        ),
        pytest.param(
            _set("worker", "depends_on", {"migrate": {"condition": "done"}}),
            "services.worker.depends_on.migrate.condition: 'done' is not one of",
            id="bad-depends-on-condition",
        ),
        pytest.param(_obsolete_version, "version", id="obsolete-version-key"),
        pytest.param(_literal_seal_keys, "LIYAGENT_SEAL_KEYS", id="seal-keys-in-file"),
        pytest.param(
            _front_token(None),
            "services.app.environment: LIYAGENT_FRONT_TOKEN must be set",
            id="front-token-missing",
        ),
        pytest.param(_front_token("t0k"), "LIYAGENT_FRONT_TOKEN", id="front-token-literal"),
        pytest.param(
            _front_token("${LIYAGENT_FRONT_TOKEN:-}"),
            "LIYAGENT_FRONT_TOKEN: must be required",
            id="front-token-may-be-empty",
        ),
        pytest.param(_other_dockerfile, "compose/Dockerfile", id="other-dockerfile"),
        pytest.param(
            _set("beat", "image", "liyagent:other"), "one image name", id="second-image-name"
        ),
        pytest.param(
            _set("app", "command", "echo $ 1"), "invalid interpolation", id="bad-template"
        ),
        pytest.param(_undocumented_variable, "REDIS_TAG", id="undocumented-variable"),
    ],
)
def test_broken_copies_fail(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    result = run_validator(str(mutated_copy(tmp_path, mutate)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "compose OK" not in result.stdout
    assert expected in result.stderr, result.stderr


def test_an_image_of_the_core_alone_fails(tmp_path: Path) -> None:
    # The stack runs the front, Flower and the simulators from the image: the core's bare
    # `pip install .` would start none of them.
    copy = mutated_copy(tmp_path, lambda doc: None)
    dockerfile = copy.parent / "Dockerfile"
    text = dockerfile.read_text(encoding="utf-8")
    dockerfile.write_text(text.replace('pip install ".[all]"', "pip install ."), encoding="utf-8")
    result = run_validator(str(copy))
    assert result.returncode == 1
    assert "every extra" in result.stderr, result.stdout + result.stderr


def test_missing_file_fails(tmp_path: Path) -> None:
    result = run_validator(str(tmp_path / "nope.yaml"))
    assert result.returncode == 1
    assert "cannot read" in result.stderr


def test_yaml_syntax_error_and_duplicate_keys_fail(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  a:\n    image: x\n  a:\n    image: y\n")
    result = run_validator(str(broken))
    assert result.returncode == 1
    assert "duplicate key" in result.stderr


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("plain", "plain"),
        ("celery@$$HOSTNAME", "celery@$HOSTNAME"),
        ("${A:-x}-${B-y}", "x-y"),
        ("${A:-${B:-nested}}", "nested"),
        ("${A:?set A}", compose_yaml.PLACEHOLDER),
        ("${A?set A}", compose_yaml.PLACEHOLDER),
        ("$A/${B}", f"{compose_yaml.PLACEHOLDER}/{compose_yaml.PLACEHOLDER}"),
        ("${A:+alt}${A+alt}", ""),
        ("${FLOWER_BASIC_AUTH:?set FLOWER_BASIC_AUTH=user:password}", compose_yaml.PLACEHOLDER),
    ],
)
def test_interpolation(template: str, expected: str) -> None:
    assert compose_yaml.interpolate(template) == expected


@pytest.mark.parametrize("template", ["${", "${A", "${1A}", "${A!x}", "cost $5"])
def test_interpolation_rejects_malformed_templates(template: str) -> None:
    with pytest.raises(compose_yaml.ComposeError):
        compose_yaml.interpolate(template)


def test_interpolation_ignores_the_callers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIYAGENT_ENV", "development")
    assert compose_yaml.interpolate("${LIYAGENT_ENV:-production}") == "production"


def test_yaml_is_read_as_compose_reads_it(tmp_path: Path) -> None:
    """YAML 1.2 scalars: `no` and `on` stay strings and `55:55` is not a base-60 number."""
    path = tmp_path / "c.yaml"
    path.write_text("a: no\nb: on\nc: 55:55\nd: true\ne: 0o10\nf: 010\ng: ~\n")
    assert compose_yaml.load_compose(path) == {
        "a": "no",
        "b": "on",
        "c": "55:55",
        "d": True,
        "e": 8,
        "f": 10,
        "g": None,
    }


def test_real_file_shape() -> None:
    """The services and settings the brief asks for, read from the interpolated document."""
    names: set[str] = set()
    doc = compose_yaml.interpolate_tree(compose_yaml.load_compose(COMPOSE_FILE), names)
    services = doc["services"]
    assert set(services) == {
        "postgres",
        "redis",
        "migrate",
        "app",
        "worker",
        "ops-worker",
        "beat",
        "flower",
        "simulators",
    }
    assert set(doc["volumes"]) == {"pgdata", "redisdata"}
    assert "version" not in doc
    assert services["migrate"]["restart"] == "no"
    assert services["worker"]["stop_signal"] == "SIGTERM"
    assert services["worker"]["stop_grace_period"] == "60s"
    assert services["worker"]["depends_on"]["migrate"]["condition"] == (
        "service_completed_successfully"
    )
    assert services["worker"]["healthcheck"]["test"][1].startswith(
        "celery -A liyagent.worker inspect ping -d celery@$HOSTNAME"
    )
    assert services["flower"]["ports"] == ["127.0.0.1:5555:5555"]
    assert services["simulators"]["profiles"] == ["simulators"]
    assert services["redis"]["command"] == ["redis-server", "--appendonly", "yes"]
    env = services["worker"]["environment"]
    assert env["LIYAGENT_DATABASE_URL"] == (
        "postgresql+psycopg://postgres:liyagent@postgres:5432/liyagent"
    )
    assert env["LIYAGENT_REDIS_URL"] == "redis://redis:6379/0"
    assert env["LIYAGENT_ENV"] == "production"
    assert services["simulators"]["environment"] == {
        "LIYAGENT_DATABASE_URL": env["LIYAGENT_DATABASE_URL"]
    }
    assert {"LIYAGENT_SEAL_KEYS", "FLOWER_BASIC_AUTH", "POSTGRES_PASSWORD"} <= names
    # The front gets a bearer token (without one it answers 503 to every request), and the
    # rest of the shared environment with it.
    app_env = services["app"]["environment"]
    assert app_env["LIYAGENT_FRONT_TOKEN"] == compose_yaml.PLACEHOLDER
    assert "LIYAGENT_FRONT_TOKEN" in names
    # Only the workers get the Teams bot's password (they reply as the bot), as a secret file.
    shared = {k: v for k, v in env.items() if k != "LIYAGENT_TEAMS_APP_PASSWORD_FILE"}
    assert {k: app_env[k] for k in shared} == shared
    assert "LIYAGENT_TEAMS_APP_PASSWORD_FILE" not in app_env
    for name in ("app", "worker", "ops-worker", "flower", "simulators", "postgres", "redis"):
        assert "healthcheck" in services[name], name
