"""Process-wide state has one owner, runtime/base/process.py: every module-level cache, lock,
thread-local, lazily set global and memoised function of the product has a row in its `STATE`
(saying what a forked child does with it), the owner's hook is the only fork hook, Celery's
child start calls the owner only, and no module keys a cache by its process id (fork handling
of its own). Read from the source, as tests/unit/test_layers.py reads imports."""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest

from runtime.base import process
from runtime.base.process import STATE, AtFork

ROOT = Path(__file__).resolve().parents[3]
# The product: the engine, its glue, its front and its public package (the simulators and the
# bench's plain-Celery baseline are other programs).
PACKAGES = ("store", "runtime", "tasks", "front", "liyagent")
OWNER = ROOT / "runtime" / "base" / "process.py"

_EMPTY = {"dict", "list", "set", "OrderedDict", "defaultdict", "Counter", "deque"}
_THREADING = {"Lock", "RLock", "local", "Event", "Condition", "Semaphore", "BoundedSemaphore"}
_MEMO = {"cache", "lru_cache"}
_OWNED = {"Cache", "ThreadLocal"}


def _files() -> list[Path]:
    found = [ROOT / "celeryconfig.py", ROOT / "beat_schedule.py"]
    for name in PACKAGES:
        found += [p for p in (ROOT / name).rglob("*.py") if "migrations/versions" not in str(p)]
    return [p for p in found if p != OWNER]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _called(node: ast.AST) -> str:
    """The last name of what `node` calls (`threading.Lock()` -> "Lock"), or ""."""
    if not isinstance(node, ast.Call):
        return ""
    func = node.func.func if isinstance(node.func, ast.Call) else node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_state(value: ast.expr) -> bool:
    """A module-level value that is state: an empty container, a lock or thread-local, or one
    of the owner's caches (constants are written out, so they are never empty)."""
    if isinstance(value, ast.Dict | ast.List | ast.Set) and not (
        value.keys if isinstance(value, ast.Dict) else value.elts
    ):
        return True
    if not isinstance(value, ast.Call):
        return False
    name = _called(value)
    if name in _EMPTY:
        return not value.args or name == "defaultdict"
    return name in _THREADING | _OWNED


def _state_in(tree: ast.Module) -> set[str]:
    """The names of a module's process-wide state, as the owner's rows name them."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_state(node.value):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is not None and _is_state(node.value):
            if isinstance(node.target, ast.Name):
                found.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            _called(d) in _MEMO or _name(d) in _MEMO for d in node.decorator_list
        ):
            found.add(node.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(node.names)
        elif isinstance(node, ast.Call) and _called(node) in _OWNED | {"track"}:
            found.add(ast.literal_eval(node.args[1]))
    return found


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _declared() -> set[tuple[str, str]]:
    return {(s.module, n) for s in STATE for n in s.names}


def _bound(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


@functools.cache
def _trees() -> dict[str, ast.Module]:
    return {_module(p): ast.parse(p.read_text(), filename=str(p)) for p in _files()}


def test_every_process_wide_state_has_a_row_in_the_owner() -> None:
    unlisted = sorted(
        f"{module}:{name}"
        for module, tree in _trees().items()
        for name in _state_in(tree)
        if (module, name) not in _declared()
    )
    assert unlisted == [], (
        "process-wide state without a row in runtime/base/process.py's STATE (say what a "
        "forked child does with it, and why):\n" + "\n".join(unlisted)
    )


def test_owned_state_is_declared_in_its_own_module() -> None:
    """A `Cache`, `ThreadLocal` or tracked object names the module it is made in."""
    elsewhere = sorted(
        f"{module}: {ast.unparse(node)}"
        for module, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _called(node) in _OWNED | {"track"}
        and ast.literal_eval(node.args[0]) != module
    )
    assert elsewhere == []


def test_every_row_names_state_that_is_there() -> None:
    """No stale row: each name is bound at the top of its module, and a `reset` is a function
    of that module."""
    trees = _trees()
    missing = sorted(
        f"{s.module}:{n}"
        for s in STATE
        for n in (*s.names, *([s.reset] if s.reset else []))
        if s.module not in trees or n not in _bound(trees[s.module])
    )
    assert missing == []


def test_the_owners_hook_is_the_only_fork_hook() -> None:
    hooks = sorted(
        _module(p)
        for p in _files()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "register_at_fork"
    )
    assert hooks == []


def test_celerys_child_start_calls_the_owner_only() -> None:
    connected = {
        _module(p)
        for p in _files()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "worker_process_init"
    }
    assert connected == {"tasks.lifecycle"}
    tree = ast.parse((ROOT / "tasks" / "lifecycle.py").read_text())
    handler = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("worker_process_init" in ast.unparse(d) for d in node.decorator_list)
    )
    assert [ast.unparse(s) for s in handler.body] == ["process.child_started()"]


def test_no_cache_is_keyed_by_the_process_id() -> None:
    """A pid in a key or compared is fork handling of a module's own: the owner's row says it."""
    keyed = sorted(
        f"{_module(p)}:{node.lineno}"
        for p in _files()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Tuple | ast.Compare | ast.Subscript)
        and any(_called(n) == "getpid" for n in ast.walk(node))
    )
    assert keyed == []


def test_the_scan_sees_each_kind_of_state() -> None:
    """The scan is not blind: each form it refuses is found in a module written for it."""
    source = (
        "import functools, threading\n"
        "from runtime.base import process\n"
        "_a = {}\n_b: list[int] = []\n_c = threading.Lock()\n_d = threading.local()\n"
        "_e = process.Cache('m', 'e')\n"
        "@functools.lru_cache(maxsize=2)\ndef f(): pass\n"
        "@functools.cache\ndef g(): pass\n"
        "def h():\n    global _z\n    _z = 1\n"
        "class K:\n    def __init__(self):\n        process.track('m', 'K', self)\n"
        "class L:\n    def __init__(self):\n        self.c = process.Cache('m', 'L')\n"
        "CONSTANT = {'x': 1}\nNAMES = ['a']\n"
    )
    expected = {"_a", "_b", "_c", "_d", "_e", "e", "f", "g", "_z", "K", "L"}
    assert _state_in(ast.parse(source)) == expected


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_cache_starts_over_in_a_forked_child_as_its_row_says() -> None:
    """Through a real fork: the FORGET cache and thread-local are empty in the child (the CLOSE
    cache's entries closed there, not in the parent), the KEEP cache keeps its entries, and
    each stays whole in the parent."""
    forget = process.Cache[str, int]("runtime.entries.teams.connector", "_tokens")
    keep = process.Cache[str, int]("runtime.core.entry", "_points")
    closed: list[int] = []
    close = process.Cache[str, int]("runtime.services", "_services", on_drop=closed.append)
    local = process.ThreadLocal("runtime.sending.http", "_local")
    for cache in (forget, keep, close):
        cache.get("k", lambda: 7)
    local.value = 7
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say what it sees, then leave at once
        seen = (len(forget.items), len(keep.items), len(close.items), closed, local.__dict__)
        os.write(write, repr(seen).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1000).decode() == "(0, 1, 0, [7], {})"
    assert (forget.items, keep.items, close.items, closed) == ({"k": 7}, {"k": 7}, {"k": 7}, [])
    assert local.value == 7


def test_an_undeclared_cache_is_refused() -> None:
    with pytest.raises(LookupError, match=r"runtime/base/process\.py"):
        process.Cache("runtime.nowhere", "_cache")
    with pytest.raises(ValueError, match="forgotten at fork"):
        process.ThreadLocal("store.db", "sql")


def test_rows_say_why_and_a_reset_only_where_no_cache_does_it() -> None:
    assert all(s.why and s.at_fork in AtFork for s in STATE)
    assert [s.module for s in STATE if s.reset] == ["store.db"]
