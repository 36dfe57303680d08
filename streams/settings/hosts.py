"""ORACULAR_API_HOSTS: the host names the lookup API's /v1/ endpoints answer to
(`streams.lookup.crosssite` uses it against DNS rebinding)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Hosts:
    """The host names the API answers to, besides IP addresses and `localhost`."""

    names: frozenset[str] = frozenset()
    any: bool = False
    """ORACULAR_API_HOSTS=*: every name (rebinding is then the network's business)."""

    @classmethod
    def of(cls, setting: str | None, own: Iterable[str] = ()) -> Hosts:
        """ORACULAR_API_HOSTS (comma-separated names, or `*`) and the server's own names."""
        items = [host_name(item) for item in (setting or "").split(",") if item.strip()]
        if "*" in items:
            return cls(any=True)
        return cls(frozenset(items) | {host_name(n) for n in own if n and n.strip()})

    def allows(self, host: str) -> bool:
        name = host_name(host)
        if self.any or name == "localhost" or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return name in self.names
        return True  # a page can only be same-origin with an address by being served from it


def problems(setting: str) -> list[str]:
    """What is wrong with an ORACULAR_API_HOSTS value (empty: nothing)."""
    out = []
    for item in setting.split(","):
        name = item.strip()
        if not name:
            out.append("an empty name between commas")
        elif name != "*" and (any(c in name for c in "/:@ \t[]") or len(name) > 253):
            out.append(f"{name[:64]!r} is not a host name (no scheme, port or path)")
    return out


def host_name(text: str) -> str:
    return text.strip().lower().rstrip(".")
