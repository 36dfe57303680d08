"""What keeps a web page from using the lookup API through its reader's browser.

A browser on a machine that can reach the API runs any page's scripts, and a page may send
some requests to any address without asking first (no CORS preflight). What the API does about
each way in:

- A "simple" POST (Content-Type text/plain, a form, multipart) to /v1/users/{u}/revealed
  would suppress a user's prompts. Every POST must say `application/json` (else 415): a
  browser sends that cross-site only after a preflight, which the API never grants.
- A page's request carries its `Origin`. One that is not this server's own origin (the
  request's Host, host and port) is refused (403); so is the opaque `null` origin.
- DNS rebinding: the attacker's name, resolved again to the API's address, makes the page
  same-origin with the API, and the browser then sends the attacker's name as `Host`. The
  /v1/ endpoints answer only a Host that is an IP address, `localhost` (or a name under it),
  this machine's name, the advertised URL's host, or a name in ORACULAR_API_HOSTS (else 421).
  The health and metrics endpoints hold no user's data and are not checked, so probes and
  scrapers may use any name.

Clients that are not browsers send no Origin and their own Host; nothing changes for them.
"""

from __future__ import annotations

from collections.abc import Mapping

from yarl import URL

from streams.lookup.serving import ApiError
from streams.settings.hosts import Hosts, host_name

JSON_TYPE = "application/json"
UNCHECKED_PATHS = frozenset({"/livez", "/readyz", "/metrics", "/openapi.json"})
"""No user's data: probes and scrapers may name the worker as they like."""


def check_request(
    method: str, path: str, headers: Mapping[str, str], secure: bool, hosts: Hosts
) -> None:
    """Refuse a request a foreign page could have sent (ApiError 415, 403 or 421)."""
    if method == "POST":
        kind = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if kind != JSON_TYPE:
            msg = f"a POST body must be sent as Content-Type: {JSON_TYPE}, not {kind[:64]!r}"
            raise ApiError(415, msg)
    host = headers.get("Host", "")
    origin = headers.get("Origin")
    if origin is not None and not _same_origin(origin, host, secure):
        msg = f"requests from the page at {origin[:100]!r} are not served (not this server)"
        raise ApiError(403, msg)
    if path in UNCHECKED_PATHS or not host:
        return  # HTTP/1.0 without a Host: not a browser's request
    try:
        name = _split(host)[0]
    except ValueError:
        raise ApiError(
            400, f"the Host header {host[:100]!r} has a port that is not a number"
        ) from None
    if not hosts.allows(name):
        msg = (
            f"this server is not {name[:100]!r}: ask it by an IP address, its own name or its "
            "advertised URL, or add the name to ORACULAR_API_HOSTS"
        )
        raise ApiError(421, msg)


def _same_origin(origin: str, host: str, secure: bool) -> bool:
    try:
        url = URL(origin)
        name, port = _split(host)
    except ValueError:
        return False
    if url.scheme not in ("http", "https") or not url.host or url.path not in ("", "/"):
        return False  # "null", file:, a path: never this server's origin
    default = 443 if secure else 80
    return (
        (url.scheme == "https") == secure
        and host_name(url.host) == host_name(name.strip("[]"))
        and (url.port or default) == (port or default)
    )


def _split(host: str) -> tuple[str, int | None]:
    """'name:port', '[v6]:port', 'name' -> (name, port). Raises ValueError for a bad port."""
    host = host.strip()
    if host.startswith("["):
        end = host.find("]")
        name, rest = host[: end + 1], host[end + 1 :]
        return name, int(rest[1:]) if rest.startswith(":") else None
    name, colon, port = host.rpartition(":")
    if not colon or ":" in name:  # no port, or a bare IPv6 address
        return host, None
    return name, int(port)
