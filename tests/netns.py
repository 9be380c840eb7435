"""Machines made of network namespaces: each host its own namespace with one address on a
private link (a bridge in the test's namespace, which has an address on it too), so the
processes of a stack reach each other only as they would across machines. A host's link
can be cut and restored. Needs root and iproute2 (`ip netns`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field

SUBNET = "10.29.{}"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def available() -> str:
    """Why namespaces cannot be made here, or "" when they can."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"hp{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"ip netns add failed: {exc.stderr.decode().strip()}"
    _ip("netns", "del", probe)
    return ""


@dataclass
class Network:
    """A bridge and the hosts on it; `close()` removes them all."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    subnet: int = 0
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address
    _links: dict[str, str] = field(default_factory=dict)  # name -> the bridge's end

    def __post_init__(self) -> None:
        self.subnet = int(self.tag, 16) % 200 + 20
        self.bridge = f"hb{self.tag}"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.address(254)}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def address(self, n: int) -> str:
        return f"{SUBNET.format(self.subnet)}.{n}"

    @property
    def gateway(self) -> str:
        """The test's own address on the link."""
        return self.address(254)

    def netns(self, name: str) -> str:
        return f"h{self.tag}{name}"

    def add_host(self, name: str) -> str:
        """A namespace with loopback and one address on the link; returns the address."""
        n = len(self.hosts) + 1
        ns, outer, inner = self.netns(name), f"hv{self.tag}{n}", f"hi{self.tag}{n}"
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("-n", ns, "addr", "add", f"{self.address(n)}/24", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = self.address(n)
        self._links[name] = outer
        return self.address(n)

    def run_in(self, name: str) -> list[str]:
        """The argv prefix that runs a command on host `name`."""
        return ["ip", "netns", "exec", self.netns(name)]

    def cut(self, name: str) -> None:
        _ip("link", "set", self._links[name], "down")

    def restore(self, name: str) -> None:
        _ip("link", "set", self._links[name], "up")

    def close(self) -> None:
        for name in self.hosts:
            ns = self.netns(name)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
