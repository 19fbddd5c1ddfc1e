"""liyagent's bench (`make bench`, `python -m bench`): see bench/README.md."""

METHOD: dict[str, str] = {}
