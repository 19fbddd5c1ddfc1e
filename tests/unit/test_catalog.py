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
