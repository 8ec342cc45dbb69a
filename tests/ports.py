"""Ports for the servers and rendezvous stores the tests start.

Binding port 0 and closing the socket is not enough: the kernel hands ports out of its ephemeral
range (/proc/sys/net/ipv4/ip_local_port_range) to every connection and port-0 bind on the
machine, so the port can be taken again before the test's server binds it. With tests, jobs and
servers running side by side that happened (a stand-in rendezvous failed with EADDRINUSE). The
ports here come from below that range, where nothing is handed out unasked, at random (tests in
other processes pick their own), and each is checked free by binding it.
"""
import random
import socket


def _ephemeral_start():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n, host="127.0.0.1"):
    """`n` distinct ports free on `host` now, all below the ephemeral range."""
    low, high = 10000, max(_ephemeral_start(), 10000 + 4 * n)
    socks = []
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind((host, random.randrange(low, high)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host="127.0.0.1"):
    return free_ports(1, host)[0]
