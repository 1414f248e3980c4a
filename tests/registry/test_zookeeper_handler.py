"""The ZooKeeper backend's kazoo handler: ``select`` answers as kazoo's own does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from shardkeeper.registry.zookeeper.handler import BufferedSocket, PollingHandler
from shardkeeper.testing.faults import wait_until


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


def test_buffered_bytes_make_the_socket_ready_without_the_kernel(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """kazoo reads a packet in small pieces: the first read takes all the kernel holds,
    the rest is served from the buffer, and ``select`` reports the socket ready while
    bytes are buffered (the kernel has none left: a poll alone would wait out its
    timeout and report nothing)."""
    a, b = pair
    h = PollingHandler()
    buffered = BufferedSocket(a)
    b.sendall(b"0123456789")
    assert h.select([buffered], [], [], 1.0) == ([buffered], [], [])
    assert buffered.recv(4) == b"0123"
    assert buffered.pending() == 6
    assert h.select([buffered], [], [], 0.5) == ([buffered], [], [])
    assert buffered.recv(100) == b"456789"  # what is buffered, no more
    assert buffered.pending() == 0
    assert h.select([buffered], [], [], 0.05) == ([], [], [])
    b.sendall(b"xy")
    assert buffered.recv(100) == b"xy"
    # everything else is the real socket's
    assert buffered.fileno() == a.fileno()


def test_a_buffered_socket_does_not_starve_the_others(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """While replies wait in the buffer, kazoo's request wake-up (another socket) is
    still reported when it is ready, and not waited for when it is not."""
    a, b = pair
    wake_r, wake_w = socket.socketpair()
    try:
        h = PollingHandler()
        buffered = BufferedSocket(a)
        b.sendall(b"abcd")
        assert buffered.recv(1) == b"a"
        assert h.select([buffered, wake_r], [], [], 5.0) == ([buffered], [], [])
        wake_w.sendall(b"!")
        # polled again within a millisecond, while the buffer still holds bytes
        wait_until(lambda: h.select([buffered, wake_r], [], [], 5.0)[0] == [buffered, wake_r], 5)
        assert buffered.pending() == 3
    finally:
        wake_r.close()
        wake_w.close()
