"""The DeviceMesh of a plan: named dims pp, dp_replicate, dp_shard, cp, tp in the plan's
`mesh_order` (outer to inner; default tp innermost, so TP ranks are neighbours), plus flattened
views used by data parallelism and data loading."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshplan.specs.plan import MESH_DIMS, Plan


@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    order: tuple[str, ...] = MESH_DIMS  # mesh dims outer -> inner: which ranks share each group
    ep: int = 1  # expert parallelism, folded into dp_shard x cp x tp (expert_parallel.py)

    @classmethod
    def from_plan(cls, plan: Plan) -> "ParallelDims":
        p = plan.parallel
        order = tuple(plan.mesh_order) if plan.mesh_order else MESH_DIMS
        return cls(pp=p.pp, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp, order=order,
                   ep=int(p.ep))

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: ranks that read different sequences."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_size(self) -> int:
        """FSDP shards over dp_shard and cp together (CP ranks hold the same parameters and their
        gradients must be averaged, exactly as across data-parallel ranks)."""
        return self.dp_shard * self.cp


@dataclass
class Meshes:
    """The 5-D mesh (size-1 dims included, so code can always slice by name) and the flattened
    1-D meshes, kept as returned by _flatten (slicing flattened dims from the root is deprecated):
    `dp_shard_cp` (the FSDP group), `dp` (data loading), `cp_tp` (the ranks sharing a micro-batch's
    tokens) and `stage` (every rank of a pipeline stage); with expert parallelism, `experts`, the
    routed experts' own mesh (expert_parallel.expert_mesh)."""

    root: DeviceMesh
    flat: dict[str, DeviceMesh]
    experts: DeviceMesh | None = None

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        if isinstance(names, str) and names in self.flat:
            return self.flat[names]
        return self.root[in_mesh_order(self.root, names)]


def in_mesh_order(root: DeviceMesh, names: str | tuple[str, ...]) -> str | tuple[str, ...]:
    """`names` sorted as the root mesh lays its dims out (DeviceMesh slices need that order)."""
    if isinstance(names, str):
        return names
    order = root.mesh_dim_names or ()
    return tuple(sorted(names, key=lambda n: order.index(n) if n in order else len(order)))


def build_mesh(dims: ParallelDims, device_type: str, moe: bool = False) -> Meshes:
    shape = tuple(getattr(dims, name) for name in dims.order)
    root = init_device_mesh(device_type, shape, mesh_dim_names=dims.order)
    flat = {"dp_shard_cp": root[in_mesh_order(root, ("dp_shard", "cp"))]._flatten("dp_shard_cp"),
            "dp": root[in_mesh_order(root, ("dp_replicate", "dp_shard"))]._flatten("dp")}
    experts = None
    if moe:
        flat["cp_tp"] = root[in_mesh_order(root, ("cp", "tp"))]._flatten("cp_tp")
        flat["stage"] = root[in_mesh_order(root, ("dp_replicate", "dp_shard", "cp", "tp"))]._flatten("stage")
        if dims.ep > 1:
            from meshplan.runtime.expert_parallel import expert_mesh

            experts = expert_mesh(root, dims, device_type)
    return Meshes(root, flat, experts)
