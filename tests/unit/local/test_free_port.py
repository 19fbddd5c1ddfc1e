"""A private server's port is drawn below the kernel's ephemeral range, where no outgoing
connection's local port can take it between its choice and the server's start."""

from __future__ import annotations

import socket

from liyagent.local.servers import ephemeral_low, free_port
from tests.support.proxy import CuttableProxy


def test_a_free_port_is_below_the_ephemeral_range_and_free() -> None:
    port = free_port()
    assert 1024 <= port < ephemeral_low()
    with socket.create_server(("127.0.0.1", port)):
        pass


def test_a_cut_proxy_listens_again_on_its_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as target:
        proxy = CuttableProxy("127.0.0.1", target.getsockname()[1])
        assert proxy.port < ephemeral_low()
        proxy.cut()
        again = CuttableProxy("127.0.0.1", target.getsockname()[1], port=proxy.port)
        with socket.create_connection(("127.0.0.1", again.port), timeout=5):
            pass
        again.cut()
