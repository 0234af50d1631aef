"""Ports chosen for servers and rendezvous that start later: outside the kernel's ephemeral range, so
no outgoing connection of the ranks starting beside them can take one first."""

import socket

from dockyard.distributed import ephemeral_ports, free_port


def test_free_ports_are_below_the_ephemeral_range_and_can_be_listened_on():
    low, _ = ephemeral_ports()
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports)
    assert len(ports) > 1   # random, so two runs starting at once do not pick the same one
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()


def test_a_port_someone_listens_on_is_not_handed_out():
    low, _ = ephemeral_ports()
    taken = []
    try:
        for port in range(max(1024, low - 12000), low):   # listen on the whole range but one port
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                sock.close()
                continue
            taken.append(sock)
        free = taken.pop()
        free.close()
        assert free_port() not in {s.getsockname()[1] for s in taken}
    finally:
        for sock in taken:
            sock.close()


def test_a_port_handed_out_and_not_yet_listened_on_is_not_handed_out_again(monkeypatch):
    """`dockyard run` picks the ranks' rendezvous port, then starts the data plane's broker: the broker
    once got the same port and rank 0 failed with EADDRINUSE."""
    import dockyard.distributed as distributed

    monkeypatch.setattr(distributed, "_HANDED_OUT", set())
    monkeypatch.setattr(distributed, "ephemeral_ports", lambda: (1026, 60999))   # two candidates: 1024, 1025
    first, second = free_port(), free_port()
    assert {first, second} == {1024, 1025}
    assert free_port() not in {1024, 1025}   # none left below the range: the kernel's choice
