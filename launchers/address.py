"""``HOST:PORT``: the one parser for every address the platform or job.yaml gives.

Addresses come as ``host:port``, ``[ipv6]:port`` (a bare IPv6 address is ambiguous and is
refused), or — where a default port exists — a host alone. Parameter-server lists, TF_CONFIG,
``--init_method tcp://HOST:PORT``, ``PET_RDZV_ENDPOINT`` and ``high_availability.controller``
are all read here, so ``[fe80::1]:2222`` means the same thing everywhere.
"""

from __future__ import annotations

import contextlib
import re

from launchers.errors import PlatformError

_ADDRESS = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%[\w.-]+)?)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>[0-9]{1,5}))?"
)


class AddressError(PlatformError, ValueError):
    """An address that is not ``HOST:PORT``; a ``ValueError`` too, so job.yaml validators may raise it."""


def split_host_port(text: str, what: str, *, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); IPv6 brackets are removed.

    ``default_port`` allows a host alone; without it the port is required. ``what`` names the
    setting in the error (``--worker_hosts``, ``high_availability.controller``, ...).
    """
    value = text.strip()
    match = _ADDRESS.fullmatch(value)
    if not match:
        hint = " (put an IPv6 address in brackets, e.g. [fe80::1]:2222)" if value.count(":") > 1 else ""
        raise AddressError(f"{what}={text!r} is not HOST:PORT{hint}; expected e.g. 10.0.0.1:2222")
    host = match.group("v6") or match.group("host")
    if match.group("port") is None:
        if default_port is None:
            raise AddressError(f"{what}={text!r} has no port; expected HOST:PORT, e.g. {host}:2222")
        return host, default_port
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise AddressError(f"{what}={text!r}: port {port} is not a TCP port (1..65535)")
    return host, port


def address_host(address: str) -> str:
    """The host of ``HOST[:PORT]`` (brackets removed), or ``address`` as it is when it is no address.

    For comparing and showing hosts, where an odd entry is reported elsewhere, not here.
    """
    match = _ADDRESS.fullmatch(address.strip())
    return (match.group("v6") or match.group("host")) if match else address


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_tcp_url(url: str, what: str = "--init_method") -> tuple[str, int]:
    """``tcp://host:port`` → (host, port), with an error that shows the expected form."""
    text = url.strip()
    if text.startswith("tcp://"):
        rest = text[len("tcp://") :]
        with contextlib.suppress(AddressError):
            return split_host_port(rest[:-1] if rest.endswith("/") else rest, what)
    raise PlatformError(f"{what}={url!r} is not a TCP address; expected tcp://HOST:PORT, e.g. tcp://10.0.0.1:6666")
