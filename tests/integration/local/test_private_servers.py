"""The private servers tests and the bench start: a Postgres whose chosen port another process
took before its first start (initdb takes seconds, and the kernel hands ephemeral ports to
other processes' connections meanwhile) starts on another, instead of failing the test."""

from __future__ import annotations

import socket
import subprocess

import pytest

from liyagent.local.servers import PrivatePostgres, reachable


def test_a_postgres_whose_port_was_taken_before_it_started_takes_another() -> None:
    pg = PrivatePostgres().init()
    taken = pg.port
    try:
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", taken))
            squatter.listen()
            pg.start()
            assert pg.port != taken and reachable("127.0.0.1", pg.port)
        # A restart keeps the port it has: clients hold its URL.
        pg.stop()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", pg.port))
            squatter.listen()
            with pytest.raises(subprocess.CalledProcessError):
                pg.start()
    finally:
        pg.stop()
