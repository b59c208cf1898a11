"""ZMQ endpoints as vLLM's KV-events config writes them: `tcp://HOST:PORT`, `ipc://PATH`,
`inproc://NAME`; checked up front so a typo is one line, and offset per data-parallel rank."""

from __future__ import annotations

import ipaddress
import re

_TCP = re.compile(r"^tcp://(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]]+):(?P<port>[0-9]+)$")


def check_endpoint(text: str, option: str, *, ranks: int = 1) -> str:
    """`text` if it is an endpoint ZMQ can use (with room for `ranks` consecutive ports), else a
    ValueError saying, in one line, what `option` should look like."""
    if text.startswith(("ipc://", "inproc://")) and text.partition("://")[2]:
        if ranks > 1 and text.startswith("ipc://"):
            raise ValueError(f"{option}: several data-parallel ranks need a tcp:// endpoint (a port per rank)")
        return text
    match = _TCP.match(text)
    if match is None:
        raise ValueError(f"{option} must look like tcp://HOST:PORT (or ipc://PATH), got {text!r}")
    host = match["host"]
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{option}: {host} is not an IPv6 address") from None
    port = int(match["port"])
    if not 1 <= port <= 65535 - (ranks - 1):
        top = 65535 - (ranks - 1)
        raise ValueError(f"{option}: port {port} is not between 1 and {top}" + (
            f" (ranks use port + 0 .. {ranks - 1})" if ranks > 1 else ""))
    return text


def offset_port(endpoint: str, rank: int) -> str:
    """The endpoint of data-parallel rank `rank`: a tcp port + rank, an inproc name + `_dp<rank>`
    (vLLM ZmqEventPublisher.offset_endpoint_port; an ipc path has no per-rank form there either)."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{rank}"
    raise ValueError(f"{endpoint}: no endpoint for data-parallel rank {rank} (use tcp://HOST:PORT)")


def is_ipv6(endpoint: str) -> bool:
    """Whether `endpoint` names an IPv6 address (`tcp://[::1]:5557`): a ZMQ socket binds or
    connects there only with its IPV6 option set (`zmq_socket(zmq.IPV6, 1)`)."""
    return endpoint.startswith("tcp://[")


def open_socket(context, kind: int, endpoint: str, *, bind: bool):
    """A ZMQ socket of `kind` bound to, or connected to, `endpoint` (IPv6 enabled when it needs it);
    closed again if that fails."""
    import zmq

    sock = context.socket(kind)
    try:
        if is_ipv6(endpoint):
            sock.setsockopt(zmq.IPV6, 1)
        (sock.bind if bind else sock.connect)(endpoint)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock
