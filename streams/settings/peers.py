"""The peers a worker forwards lookups to (`ORACULAR_API_PEERS`): a settings value, parsed and
checked here so that `load_settings` needs neither the engine nor the lookup API."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: Final[tuple[Network, ...]] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)


@dataclass(frozen=True, slots=True)
class Peers:
    """Where a worker forwards lookups: the other workers' URLs that Faust's group shares are
    taken only if their host is a name listed here or all its addresses are in a network
    listed here (`ORACULAR_API_PEERS`; docs/serving.md "Forwards")."""

    networks: tuple[Network, ...] = LOOPBACK
    names: frozenset[str] = frozenset()
    anywhere: bool = False

    @classmethod
    def parse(cls, text: str) -> Peers:
        """`*`, or a comma-separated list of host names, addresses and CIDR networks.

        Raises:
            ValueError: an entry that is none of those (the message names it).
        """
        networks: list[Network] = []
        names: set[str] = set()
        for raw in text.split(","):
            entry = raw.strip().lower()
            if entry == "*":
                return cls((), frozenset(), anywhere=True)
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            if not _HOST_NAME.fullmatch(entry):
                msg = f"{raw.strip()!r} is not a host name, an address or a CIDR network"
                raise ValueError(msg)
            names.add(entry.rstrip("."))
        if not networks and not names:
            msg = "lists no peer (use * for any)"
            raise ValueError(msg)
        return cls(tuple(networks), frozenset(names))

    @classmethod
    def around(cls, hosts: Iterable[str], brokers: Iterable[str]) -> Peers:
        """The default: loopback, the addresses in `hosts` (this host's), and the networks
        of the brokers' addresses (/24 for IPv4, /64 for IPv6)."""
        networks: list[Network] = list(LOOPBACK)
        for address in hosts:
            networks.append(ipaddress.ip_network(address.split("%", 1)[0]))
        for address in brokers:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            prefix = 24 if ip.version == 4 else 64
            networks.append(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
        return cls(tuple(dict.fromkeys(networks)))

    def allows(self, host: str, addresses: Iterable[str]) -> bool:
        """May a forward go to `host`, which resolves to `addresses`? By name, or every
        address inside the listed networks (a name with one address outside is refused)."""
        if self.anywhere or host.lower().rstrip(".") in self.names:
            return True
        ips = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
        return bool(ips) and all(any(ip in net for net in self.networks) for ip in ips)

    def describe(self) -> str:
        if self.anywhere:
            return "*"
        return ", ".join([*map(str, self.networks), *sorted(self.names)])


_HOST_NAME: Final = re.compile(r"(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?\.?)+")
