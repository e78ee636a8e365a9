"""Cluster cards: the devices a plan may use and the links that join them.

A card is a small YAML file (``clusters/*.yaml`` ships a few; any path works too)::

    name: h200-sxm-node
    source: where the numbers come from (a datasheet, a measurement and its command)
    device: {name: NVIDIA H200, memory_gib: 140.4}
    nodes: 1
    devices_per_node: 8
    links:
      nvlink: {latency_us: 3.0, bandwidth_gb_s: 450, efficiency: 0.8}
    intra_node: nvlink      # the link class between two devices of one node
    inter_node: null        # between nodes (required when nodes > 1)

A link moves ``bytes`` in ``latency + bytes / (bandwidth × efficiency)`` seconds (bandwidth in
GB/s = 1e9 bytes per second, per direction). Every bad value is refused in one line that names it
and says what is allowed. Nothing here imports torch (the CLI starts fast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

GIB = 2**30
LINK_CLASSES = ("nvlink", "pcie", "ib", "ethernet", "loopback")


class PlanError(ValueError):
    """Bad planner input: one line naming the bad value and what is allowed."""


@dataclass(frozen=True)
class Link:
    """A link class: latency (s), bandwidth (bytes/s per direction) and the share of it reached."""

    name: str
    latency_s: float
    bandwidth: float
    efficiency: float = 1.0

    def seconds(self, nbytes: float) -> float:
        """Time to move ``nbytes`` once: latency + bytes / effective bandwidth (0 bytes: nothing sent)."""
        return 0.0 if nbytes <= 0 else self.latency_s + nbytes / self.effective

    @property
    def effective(self) -> float:
        """Bytes per second actually reached."""
        return self.bandwidth * self.efficiency


LOCAL = Link("local", 0.0, math.inf)  # two stages on one device: the activation stays where it is


@dataclass(frozen=True)
class Cluster:
    """Devices (``nodes`` × ``devices_per_node``, each ``memory_bytes``) and their links."""

    name: str
    device: str
    memory_bytes: float
    nodes: int
    devices_per_node: int
    intra: Link | None
    inter: Link | None
    source: str = ""

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    def link(self, a: int, b: int) -> Link:
        """The link between devices ``a`` and ``b`` (the same device: no transfer cost)."""
        for d in (a, b):
            if not 0 <= d < self.devices:
                raise PlanError(f"device {d} is not on cluster {self.name!r} (devices 0-{self.devices - 1})")
        if a == b:
            return LOCAL
        link = self.intra if self.node_of(a) == self.node_of(b) else self.inter
        if link is None:  # a card's check makes this unreachable for devices it has
            raise PlanError(f"cluster {self.name!r} has no link between devices {a} and {b}")
        return link

    def grown(self, devices: int) -> Cluster:
        """The same cluster with as many of its nodes as ``devices`` needs (a scan past its size)."""
        from dataclasses import replace

        nodes = max(self.nodes, math.ceil(devices / self.devices_per_node))
        if nodes > 1 and self.inter is None:
            raise PlanError(
                f"cluster {self.name!r} is one node of {self.devices_per_node} devices with no link between "
                f"nodes; {devices} devices need {nodes} nodes: allowed: a card with inter_node"
            )
        return replace(self, nodes=nodes)


def shipped_clusters() -> list[str]:
    """Names of the cards shipped with petra."""
    return sorted(
        p.name[: -len(".yaml")]
        for p in resources.files(__package__).joinpath("clusters").iterdir()
        if p.name.endswith(".yaml")
    )


def _number(card: str, where: str, value, *, low: float, inclusive: bool = False, high: float | None = None) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value >= low if inclusive else value > low) and (high is None or value <= high)
    if not ok:
        bound = f"{'>=' if inclusive else '>'} {low}" + (f" and <= {high}" if high is not None else "")
        raise PlanError(f"cluster card {card}: {where} is {value!r}; allowed: a number {bound}")
    return float(value)


def _integer(card: str, where: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"cluster card {card}: {where} is {value!r}; allowed: an integer >= 1")
    return value


def _link(card: str, name: str, spec) -> Link:
    if name not in LINK_CLASSES:
        raise PlanError(f"cluster card {card}: unknown link class {name!r}; allowed: {', '.join(LINK_CLASSES)}")
    if not isinstance(spec, dict) or set(spec) - {"latency_us", "bandwidth_gb_s", "efficiency"}:
        raise PlanError(
            f"cluster card {card}: link {name} is {spec!r}; allowed keys: latency_us, bandwidth_gb_s, efficiency"
        )
    return Link(
        name,
        _number(card, f"links.{name}.latency_us", spec.get("latency_us"), low=0, inclusive=True) * 1e-6,
        _number(card, f"links.{name}.bandwidth_gb_s", spec.get("bandwidth_gb_s"), low=0) * 1e9,
        _number(card, f"links.{name}.efficiency", spec.get("efficiency", 1.0), low=0, high=1),
    )


def link_from_spec(where: str, name: str, spec) -> Link:
    """A link of class ``name`` from ``spec`` (``latency_us``, ``bandwidth_gb_s``, ``efficiency``), as a
    card declares one; ``where`` names the declaration in an error."""
    return _link(where, name, spec)


def _pick(card: str, key: str, value, links: dict[str, Link], needed: bool) -> Link | None:
    if value is None:
        if needed:
            raise PlanError(f"cluster card {card}: {key} is missing; allowed: one of its links ({', '.join(links)})")
        return None
    if value not in links:
        raise PlanError(f"cluster card {card}: {key} is {value!r}, not one of its links; allowed: {', '.join(links)}")
    return links[value]


KEYS = {"name", "source", "device", "nodes", "devices_per_node", "links", "intra_node", "inter_node"}


def parse_cluster(data, card: str) -> Cluster:
    """A :class:`Cluster` from a card's parsed YAML (``card``: its name, for messages)."""
    if not isinstance(data, dict):
        raise PlanError(
            f"cluster card {card}: expected a mapping of {', '.join(sorted(KEYS))}, got {type(data).__name__}"
        )
    if unknown := sorted(set(data) - KEYS):
        raise PlanError(f"cluster card {card}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(KEYS))}")
    device = data.get("device")
    if not isinstance(device, dict) or not isinstance(device.get("name"), str) or set(device) - {"name", "memory_gib"}:
        raise PlanError(f"cluster card {card}: device is {device!r}; allowed: {{name: str, memory_gib: number}}")
    memory = _number(card, "device.memory_gib", device.get("memory_gib"), low=0) * GIB
    nodes, per_node = (
        _integer(card, "nodes", data.get("nodes")),
        _integer(card, "devices_per_node", data.get("devices_per_node")),
    )
    raw = data.get("links") or {}
    if not isinstance(raw, dict):
        raise PlanError(f"cluster card {card}: links is {raw!r}; allowed: a mapping of link class to its numbers")
    links = {name: _link(card, name, spec) for name, spec in raw.items()}
    intra = _pick(card, "intra_node", data.get("intra_node"), links, per_node > 1)
    inter = _pick(card, "inter_node", data.get("inter_node"), links, nodes > 1)
    return Cluster(
        str(data.get("name", card)), device["name"], memory, nodes, per_node, intra, inter, str(data.get("source", ""))
    )


def load_cluster(name_or_path: str | Path) -> Cluster:
    """A shipped card by name (``h200-sxm-node``) or a card's YAML path."""
    import yaml

    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise PlanError(f"cluster card {name_or_path}: no such file")
        text, card = path.read_text(), str(path)
    else:
        names = shipped_clusters()
        if str(name_or_path) not in names:
            raise PlanError(
                f"unknown cluster {str(name_or_path)!r}; allowed: {', '.join(names)}, or a card's .yaml path"
            )
        text = resources.files(__package__).joinpath("clusters").joinpath(f"{name_or_path}.yaml").read_text()
        card = str(name_or_path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PlanError(f"cluster card {card}: not valid YAML ({str(err).splitlines()[0]})") from None
    return parse_cluster(data, card)
