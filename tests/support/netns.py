"""A worker in a network namespace of its own, for partition trials: one veth pair per store it
reaches (Redis, Postgres, the vendors), each with a relay on the host side of its link, so a
test cuts one path (`ip link set down` inside the namespace: packets are dropped, nothing is
closed, as in a real partition) while the rest of the system keeps its own."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from dataclasses import dataclass, field

from tests.support.proxy import CuttableProxy

# The paths a namespaced worker has to the host, each its own link.
PATHS = ("redis", "postgres", "vendors")


def _ip(*args: str, ns: str | None = None) -> None:
    argv = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")


def available() -> str | None:
    """None when this process may create network namespaces (root with `ip netns`), else why
    not."""
    probe = f"lyap{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
    except (OSError, RuntimeError) as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Link:
    host_if: str
    ns_if: str
    host_ip: str
    proxy: CuttableProxy


@dataclass
class Namespace:
    """A namespace with a link per path; `close()` deletes it (and its links) and the relays."""

    targets: dict[str, tuple[str, int]]
    name: str = field(default_factory=lambda: f"lya-{uuid.uuid4().hex[:10]}")
    links: dict[str, Link] = field(default_factory=dict)

    def open(self) -> Namespace:
        tag = uuid.uuid4().hex[:6]
        # A /30 per link in 10.<200..249>.<0..255>.<4i>: unique enough for tests side by side.
        b, c = 200 + int(tag[:2], 16) % 50, int(tag[2:4], 16)
        _ip("netns", "add", self.name)
        try:
            _ip("link", "set", "lo", "up", ns=self.name)
            for i, path in enumerate(PATHS):
                host_if, ns_if = f"lyh{tag}{i}", f"lyn{tag}{i}"
                host_ip, ns_ip = f"10.{b}.{c}.{4 * i + 1}", f"10.{b}.{c}.{4 * i + 2}"
                _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
                _ip("link", "set", ns_if, "netns", self.name)
                _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
                _ip("link", "set", host_if, "up")
                _ip("addr", "add", f"{ns_ip}/30", "dev", ns_if, ns=self.name)
                _ip("link", "set", ns_if, "up", ns=self.name)
                proxy = CuttableProxy(*self.targets[path], host=host_ip)
                self.links[path] = Link(host_if, ns_if, host_ip, proxy)
        except BaseException:
            self.close()
            raise
        return self

    def address(self, path: str) -> tuple[str, int]:
        """Where the namespaced worker reaches `path` (the host side's relay)."""
        link = self.links[path]
        return link.host_ip, link.proxy.port

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self, *paths: str) -> None:
        """Take these links down inside the namespace: its packets on them go nowhere."""
        for path in paths:
            _ip("link", "set", self.links[path].ns_if, "down", ns=self.name)

    def close(self) -> None:
        """Delete the namespace (its veth ends go with it, and so do their host peers)."""
        for link in self.links.values():
            link.proxy.cut()
        with contextlib.suppress(RuntimeError, OSError):
            _ip("netns", "del", self.name)
        for link in self.links.values():  # in case a peer outlived the namespace
            with contextlib.suppress(RuntimeError, OSError):
                _ip("link", "del", link.host_if)
