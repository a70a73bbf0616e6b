"""The machines a plan is for: ranks, hosts, memory and bandwidths (``topology.json``).

Defaults come from vendor figures for common GPUs and from TorchRec's planner constants
(HBM 897 GiB/s, DDR 51 GiB/s, HBM<->DDR 32 GiB/s, intra-host 600 GiB/s, inter-host 12.5 GiB/s)
for anything not given; with them ranks never slow each other and the sharded module costs
nothing beyond its kernels and collectives, as in TorchRec's model. ``ctrctl plan
--calibrate`` measures this machine instead and saves the figures (per-dimension kernel
speeds, collective bandwidths and latency, how much work the host's ranks do at once, each
sharding type's fixed cost and its handling of pooled outputs) in a topology file that later
plans read with ``--topology``.

Example:
    >>> topo = Topology.preset("h100", world_size=64, local_world_size=8)
    >>> topo.num_hosts, topo.hbm_bytes / 2**30
    (8, 80.0)
    >>> topo.save("topology.json"); Topology.load("topology.json").world_size
    64
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.errors import FormatError, PlanError

GIB = 1024**3
TOPOLOGY_FORMAT = "ctrctl.topology"
TOPOLOGY_FORMAT_VERSION = 1

# Vendor figures: memory per GPU, HBM bandwidth, NVLink bandwidth per GPU (one direction).
_PRESETS: dict[str, dict[str, Any]] = {
    # TorchRec's defaults, for like-for-like comparisons with its planner.
    "torchrec": dict(device="cuda", hbm_bytes=32 * GIB, hbm_bw=897 * GIB, intra_host_bw=600 * GIB),
    "a100-40": dict(device="cuda", hbm_bytes=40 * GIB, hbm_bw=1555e9, intra_host_bw=300e9),
    "a100-80": dict(device="cuda", hbm_bytes=80 * GIB, hbm_bw=2039e9, intra_host_bw=300e9),
    "h100": dict(device="cuda", hbm_bytes=80 * GIB, hbm_bw=3350e9, intra_host_bw=450e9),
    "h200": dict(device="cuda", hbm_bytes=141e9, hbm_bw=4800e9, intra_host_bw=450e9),
    # A CPU rank: weights live in host memory, read at DDR speed; gloo over loopback TCP
    # moves a few GB/s between local processes (calibrate to replace these guesses).
    "cpu": dict(device="cpu", hbm_bytes=0, hbm_bw=51 * GIB, intra_host_bw=4 * GIB,
                inter_host_bw=1.25 * GIB, collective_latency_s=1e-4),
}


@dataclass(frozen=True)
class Topology:
    """Ranks and their resources; every figure per rank, bandwidths in bytes per second.

    Attributes:
        world_size: ranks.
        local_world_size: ranks per host (must divide ``world_size``).
        device: ``cuda`` or ``cpu``. On ``cpu`` the tables live in DDR and ``hbm_bytes`` is 0.
        hbm_bytes, ddr_bytes: device and host memory per rank.
        hbm_bw, ddr_bw, hbm_to_ddr_bw: memory bandwidths.
        intra_host_bw, inter_host_bw: per-rank link bandwidth within and across hosts.
        reserved_fraction: share of each memory kept for dense parameters, activations and
            the allocator's slack (TorchRec's heuristic keeps 15%).
        dense_bytes: further bytes per rank for the dense model (params, grads, state).
        cache_load_factor: default share of rows a cached table keeps on the device.
        bwd_compute_factor: backward lookup+update time over forward (TorchRec: 2).
        collective_latency_s: fixed time of one collective call.
        host_parallelism: how many ranks' worth of compute a host does at once when all
            its ranks work (None: each rank runs at full speed whatever the others do, as
            separate GPUs). On a CPU host ranks share cores (and their SMT siblings, and
            the machine with other work): two ranks that run no faster together than one
            alone measure 1.0. Calibration measures it with two ranks, so a host of more
            ranks gets at most what two showed.
        kernel_fwd_bw, kernel_bwd_bw: measured effective bandwidths of the embedding kernel
            by embedding dim (``{"64": bytes/s}``) on tables of ``kernel_table_bytes[1]``;
            when set they replace ``hbm_bw`` (or ``ddr_bw`` on cpu) and
            ``bwd_compute_factor``.
        kernel_fwd_bw_cached, kernel_bwd_bw_cached: the same on tables of
            ``kernel_table_bytes[0]`` (that fit the caches); a shard's figure is interpolated
            between the two by its size.
        kernel_table_bytes: the table sizes of those two measurements.
        collective_bw: measured bus bandwidth by collective (``all_to_all``,
            ``reduce_scatter``, ``all_gather``, ``all_reduce``) within a host.
        sharding_overhead_s: measured fixed seconds per step that using a sharding type
            adds (its collectives' latency plus the input/output distribution's own work);
            when set it replaces the latency model of each type.
        sharding_overhead_per_table_s: measured further seconds per step per table of
            each sharding type (its share of the distribution's bookkeeping).
        pooled_output_bw: measured bytes/s at which each sharding type's module handles the
            pooled vectors a shard produces, beyond the kernel and the collectives (copies
            into and out of the collectives' buffers, column gathers, the gradients' way
            back); a type not listed costs nothing there.
        dense_update_bw: measured bytes/s of a data-parallel replica's dense backward and
            update (the bytes the cost model counts: weight, gradient and optimizer state),
            as the sharded module runs it (None: the kernel's backward bandwidth, halved).
        group_assembly_bw: bytes/s (of one rank's pooled output) at which a plan of
            several sharding types splits the input between their groups and puts the
            outputs back together, forward and backward (calibration: the routed types'
            pooled-output rate, the same copies of the same vectors; None: free, as
            TorchRec).
        calibrated: where the figures came from (empty: defaults).
    """

    world_size: int
    local_world_size: int
    device: str = "cuda"
    hbm_bytes: float = 32 * GIB
    ddr_bytes: float = 128 * GIB
    hbm_bw: float = 897 * GIB
    ddr_bw: float = 51 * GIB
    hbm_to_ddr_bw: float = 32 * GIB
    intra_host_bw: float = 600 * GIB
    inter_host_bw: float = 12.5 * GIB
    reserved_fraction: float = 0.15
    dense_bytes: float = 0.0
    cache_load_factor: float = 0.2
    bwd_compute_factor: float = 2.0
    collective_latency_s: float = 2e-5
    host_parallelism: float | None = None
    kernel_fwd_bw: dict[str, float] = field(default_factory=dict)
    kernel_bwd_bw: dict[str, float] = field(default_factory=dict)
    kernel_fwd_bw_cached: dict[str, float] = field(default_factory=dict)
    kernel_bwd_bw_cached: dict[str, float] = field(default_factory=dict)
    kernel_table_bytes: tuple[float, float] = (2.0**20, 2.0**26)
    collective_bw: dict[str, float] = field(default_factory=dict)
    sharding_overhead_s: dict[str, float] = field(default_factory=dict)
    sharding_overhead_per_table_s: dict[str, float] = field(default_factory=dict)
    pooled_output_bw: dict[str, float] = field(default_factory=dict)
    dense_update_bw: float | None = None
    group_assembly_bw: float | None = None
    calibrated: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise PlanError(f"world size {self.world_size} must be at least 1")
        if self.local_world_size < 1 or self.world_size % self.local_world_size:
            raise PlanError(
                f"{self.local_world_size} ranks per host do not divide world size "
                f"{self.world_size}", hint="pass --local-world-size that divides --world-size")
        if self.device not in ("cuda", "cpu"):
            raise PlanError(f"unknown device {self.device!r}", hint="use cuda or cpu")
        if not 0 <= self.reserved_fraction < 1:
            raise PlanError(f"reserved_fraction {self.reserved_fraction} is not in [0, 1)")
        if self.host_parallelism is not None and self.host_parallelism <= 0:
            raise PlanError(f"host_parallelism {self.host_parallelism} must be positive")

    # ---- derived ---------------------------------------------------------------------
    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def hbm_available(self) -> float:
        """Device bytes per rank left for embeddings."""
        if self.device == "cpu":
            return 0.0
        return max(self.hbm_bytes * (1 - self.reserved_fraction) - self.dense_bytes, 0.0)

    @property
    def ddr_available(self) -> float:
        """Host bytes per rank left for embeddings (on cpu the dense model lives here)."""
        dense = self.dense_bytes if self.device == "cpu" else 0.0
        return max(self.ddr_bytes * (1 - self.reserved_fraction) - dense, 0.0)

    @property
    def parallel_ranks(self) -> float:
        """Ranks' worth of kernel work one host does at once with all its ranks busy."""
        if self.host_parallelism is None:
            return float(self.local_world_size)
        return min(float(self.local_world_size), self.host_parallelism)

    def comm_bw(self, collective: str, local_share: float) -> float:
        """Effective bandwidth of ``collective`` when ``local_share`` of its bytes stay on
        the host: the harmonic mix of the intra- and inter-host links."""
        intra = self.collective_bw.get(collective, self.intra_host_bw)
        inter = min(self.inter_host_bw, intra)
        remote = 1.0 - local_share
        return 1.0 / (local_share / intra + remote / inter)

    def with_world(self, world_size: int, local_world_size: int | None = None) -> Topology:
        """The same machines, another number of ranks."""
        local = local_world_size or min(self.local_world_size, world_size)
        if world_size % local:
            local = world_size
        changes: dict[str, Any] = {"world_size": world_size, "local_world_size": local}
        host_memory = self.calibrated.get("host_memory_bytes")
        if host_memory:  # a measured host: its memory is shared by the ranks on it
            changes["ddr_bytes"] = float(host_memory) / local
        return dataclasses.replace(self, **changes)

    # ---- construction ----------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, world_size: int, local_world_size: int | None = None,
               **overrides: Any) -> Topology:
        """A topology of ``name`` (``torchrec``, ``a100-40``, ``a100-80``, ``h100``,
        ``h200``, ``cpu``); ``overrides`` replace single figures (None values ignored)."""
        if name not in _PRESETS:
            raise PlanError(f"unknown device preset {name!r}",
                            hint=f"use one of {sorted(_PRESETS)}")
        values: dict[str, Any] = dict(_PRESETS[name])
        values.update({k: v for k, v in overrides.items() if v is not None})
        local = local_world_size or min(world_size, 8 if values["device"] == "cuda"
                                        else world_size)
        return cls(world_size=world_size, local_world_size=local, **values)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["format"] = TOPOLOGY_FORMAT
        data["format_version"] = TOPOLOGY_FORMAT_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "topology") -> Topology:
        if data.get("format", TOPOLOGY_FORMAT) != TOPOLOGY_FORMAT:
            raise FormatError(f"not a ctrctl topology (format={data.get('format')!r})",
                              where=where, hint="write one with `ctrctl plan --calibrate`")
        if data.get("format_version", TOPOLOGY_FORMAT_VERSION) != TOPOLOGY_FORMAT_VERSION:
            raise FormatError(f"topology format version {data.get('format_version')} is not "
                              f"supported (this ctrctl reads {TOPOLOGY_FORMAT_VERSION})",
                              where=where)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names - {"format", "format_version"})
        if unknown:
            raise FormatError(f"unknown topology keys: {', '.join(unknown)}", where=where,
                              hint=f"known keys: {', '.join(sorted(names))}")
        values = {k: v for k, v in data.items() if k in names}
        if "kernel_table_bytes" in values:  # a JSON list
            values["kernel_table_bytes"] = tuple(values["kernel_table_bytes"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise FormatError(f"malformed topology: {exc}", where=where) from exc

    def save(self, path: str | Path) -> Path:
        from ctrctl.io import write_json_atomic

        write_json_atomic(path, self.to_dict())
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, world_size: int | None = None,
             local_world_size: int | None = None) -> Topology:
        """Read ``topology.json``; ``world_size``/``local_world_size`` replace the file's."""
        from ctrctl.io import read_json_file

        data = read_json_file(path, PlanError(
            "topology file not found", where=str(path),
            hint="write one with `ctrctl plan --calibrate`"))
        topo = cls.from_dict(data, where=str(path))
        if world_size is not None:
            topo = topo.with_world(world_size, local_world_size)
        return topo
