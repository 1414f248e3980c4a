"""``registry.reach``: which failures to connect are certain (reported at once) and
which may still pass (a black hole, a host that answers): real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from shardkeeper.registry import reach


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def listening() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield int(server.getsockname()[1])
    server.close()


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port whose accept queue is full: further SYNs are dropped, never answered."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    fill = socket.create_connection(("127.0.0.1", port), timeout=2)
    yield port
    fill.close()
    server.close()


def test_every_host_refused_is_certain_and_each_is_named() -> None:
    ports = [_free_port(), _free_port()]
    answers = reach.probe([("127.0.0.1", p) for p in ports], timeout=1)
    assert [a.outcome for a in answers] == [reach.REFUSED, reach.REFUSED]
    message = reach.refusal("etcd", answers)
    assert message is not None
    assert message.startswith(f"cannot reach etcd at 127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}: ")
    assert message.count("connection refused") == 2


def test_one_host_that_answers_makes_nothing_certain(listening: int) -> None:
    answers = reach.probe([("127.0.0.1", _free_port()), ("127.0.0.1", listening)], timeout=1)
    assert [a.outcome for a in answers] == [reach.REFUSED, reach.OPEN]
    assert reach.refusal("ZooKeeper", answers) is None
    assert reach.silence_note(answers) == ""


def test_a_black_hole_is_not_certain_and_is_named_as_silent(black_hole: int) -> None:
    answers = reach.probe([("127.0.0.1", black_hole), ("127.0.0.1", _free_port())], timeout=0.5)
    assert answers[0].outcome == reach.NO_ANSWER
    assert reach.refusal("ZooKeeper", answers) is None
    note = reach.silence_note(answers)
    assert note.startswith(f"; no answer from 127.0.0.1:{black_hole}: packets to it are dropped")


def test_an_ipv6_address_is_written_in_brackets() -> None:
    answer = reach.HostAnswer("::1", 2379, reach.REFUSED)
    assert answer.address == "[::1]:2379"
    assert answer.explain().startswith("[::1]:2379: connection refused")
