"""The catalog file's agents: an agent's public `description` (the only thing of it beside its
name the A2A card shows) is read as text, and anything else there is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.core import catalog

MODEL = {"provider": "scripted", "script": {"steps": [{"final": "ok"}]}}


def _load(tmp_path: Path, agent: dict[str, object]) -> catalog.Catalog:
    path = tmp_path / "agents.json"
    path.write_text(json.dumps({"agents": {"bot": {"model": MODEL, **agent}}}))
    return catalog.load(str(path))


def test_an_agents_description_is_kept_apart_from_its_prompt(tmp_path: Path) -> None:
    bot = _load(tmp_path, {"system": "private prompt", "description": "Answers."}).agent("bot")
    assert (bot.description, bot.system) == ("Answers.", "private prompt")


def test_a_description_that_is_not_text_is_refused(tmp_path: Path) -> None:
    with pytest.raises(catalog.CatalogError, match="agent 'bot': \"description\" must be text"):
        _load(tmp_path, {"description": ["not", "text"]})


SECRET = "sk-live-0123456789abcdefCATALOG"


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ({"provider": "opnai", "model": "m"}, "agent 'bot': model.provider 'opnai' is not a known"),
        ({"provider": "openai", "model": "m", "api_key": SECRET}, "agent 'bot': model.api_key"),
        ({"provider": "openai", "model": "m", "base_url": "https://u:p@h/v1"}, "credentials"),
        ({"provider": "scripted", "script": {"steps": []}}, "a script needs at least one step"),
    ],
)
def test_a_bad_model_refuses_the_catalog_when_it_loads(tmp_path: Path, model, says) -> None:
    """Checked when the file is read, not when a run of the agent is started: the whole
    catalog is refused, naming the agent and the field, never the secret's value."""
    path = tmp_path / "agents.json"
    path.write_text(json.dumps({"agents": {"bot": {"model": model}}}))
    with pytest.raises(catalog.CatalogError) as info:
        catalog.load(str(path))
    assert says in str(info.value) and SECRET not in str(info.value)
