"""The one rule for a server URL Reef writes into something another program runs (an install
script, a wrapper): scheme, host, optional port and path, plain characters only; and which host
names are loopback."""

from __future__ import annotations

import ipaddress
import re

from reef.core.errors import InvalidInput

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_URL = re.compile(
    rf"https?://(?P<host>{_LABEL}(?:\.{_LABEL})*|\[(?P<ipv6>[0-9A-Fa-f:.]+)\])"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[A-Za-z0-9._~/-]*)?"
)


def checked_url(url: str) -> str:
    """The server URL the wrapper calls: scheme, host (a name, an IPv4 or a bracketed IPv6
    address), optional port and path of plain characters, nothing else."""
    m = _URL.fullmatch(url)
    if not m or not _plain_parts(m):
        raise InvalidInput(
            f"the server URL must look like http://host[:port][/path] with plain characters, got {url!r}"
        )
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    """Whether a host name (no port, no brackets) is this machine: localhost or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _plain_parts(m: re.Match[str]) -> bool:
    if m["port"] is not None and not 0 < int(m["port"]) < 65536:
        return False
    if m["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(m["ipv6"])
        except ValueError:
            return False
    return m["path"] is None or ("//" not in m["path"] and ".." not in m["path"])
