"""The test helper that hands out ports for nodes started later: never one an outgoing
connection could take meanwhile."""

from __future__ import annotations

import random
import socket

import pytest

from tests.helpers import _outgoing_ports_start, free_port


def test_free_ports_are_below_the_outgoing_connections_range_and_bindable() -> None:
    start = _outgoing_ports_start()
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # chosen at random, not one port over and over
    for port in ports:
        assert 1024 <= port < start
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held, socket.socket() as closed:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        # nor one a socket holds bound without listening
        closed.bind(("127.0.0.1", free_port()))
        lingering = closed.getsockname()[1]
        other = free_port()
        draws = iter([taken, lingering, other])
        monkeypatch.setattr(random, "randrange", lambda low, high: next(draws))
        assert free_port() == other
