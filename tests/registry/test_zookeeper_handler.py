"""The ZooKeeper backend's kazoo handler: ``select`` answers as kazoo's own does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from shardkeeper.registry.zookeeper.handler import PollingHandler


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_nothing_to_read_waits_out_the_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    a, _ = pair
    began = time.monotonic()
    assert PollingHandler().select([a], [], [], 0.05) == ([], [], [])
    assert time.monotonic() - began >= 0.04


def test_data_makes_the_socket_readable_and_a_buffer_with_room_writable(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    h = PollingHandler()
    assert h.select([], [a], [], 0) == ([], [a], [])
    b.sendall(b"x")
    assert h.select([a], [], [], 1.0) == ([a], [], [])
    # ready both ways: reported as readable only, as kazoo's own select does
    assert h.select([a], [a], [], 1.0) == ([a], [], [])


def test_a_closed_peer_counts_as_readable(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.close()
    r, _, _ = PollingHandler().select([a], [], [], 1.0)
    assert r == [a]
    assert a.recv(1) == b""  # the read that follows meets the end of the stream


def test_file_descriptors_are_accepted_as_numbers(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    b.sendall(b"x")
    assert PollingHandler().select([a.fileno()], [], [], 1.0) == ([a.fileno()], [], [])


def test_a_negative_timeout_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        PollingHandler().select([pair[0]], [], [], -1)
