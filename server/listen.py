"""The server's listening socket, bound before the model loads.

Loading takes from seconds to minutes; a port in use or a host this machine does not have must
fail before that, not after. `bind_listener` resolves the host and binds at once (it does not
listen yet: until the model is ready, clients get "connection refused", as from a server that
is not up, rather than a connection that hangs), and uvicorn takes the bound socket later.
"""

from __future__ import annotations

import socket

from hybrid.errors import HybridError


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), not yet listening; HybridError names the problem.

    host: an IPv4 or IPv6 address, or a name that resolves to one ("localhost"); the first
    address it resolves to is used (as uvicorn does). port 0 picks a free port.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise HybridError(f"--host {host!r} is not an address of this machine ({e}): use "
                          f"127.0.0.1 for this machine only, or 0.0.0.0 for every "
                          f"interface") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # a restarted server takes its port back at once, past the old one's TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        if e.errno == 98:  # EADDRINUSE
            raise HybridError(f"port {port} on {host} is already in use (another server, or "
                              f"an earlier hybrid serve still running): stop it or pass "
                              f"--port with a free port") from None
        raise HybridError(f"cannot listen on {host}:{port}: {e.strerror or e}: pass --host "
                          f"with an address of this machine (127.0.0.1, 0.0.0.0)") from None
    sock.set_inheritable(True)
    return sock


def bound_url(sock: socket.socket) -> str:
    """http://host:port of a bound socket (the port it got when asked for 0)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else \
        f"http://{host}:{port}"
