"""Names shared by the config, the planner and the sharded modules: a leaf with no imports.

Sharding types and compute kernels are strings in YAML, in ``plan.json`` and on the command
line; these enums are their one list. ``config`` validates against them without importing
``distributed``, and the planner and the sharding code agree on them.

Example:
    >>> ShardingType("row_wise") is ShardingType.ROW_WISE
    True
    >>> [k.value for k in ComputeKernel][:2]
    ['dense', 'fused']
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ComputeKernel", "ShardingType"]


class ShardingType(str, Enum):
    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"


class ComputeKernel(str, Enum):
    #: DP: a plain dense table, gradients all-reduced.
    DENSE = "dense"
    #: Table-batched embedding with the optimizer fused into backward, weights on the device.
    FUSED = "fused"
    #: Weights in host memory, a cache of hot rows on the device (prefetched by the pipeline).
    FUSED_UVM_CACHING = "fused_uvm_caching"
    #: Weights in host memory, read directly.
    FUSED_UVM = "fused_uvm"
    #: CPU: the whole table in a sparse file on disk, a DRAM cache of hot rows (its share of
    #: rows is the table's ``cache_load_factor``), prefetched by the pipeline.
    FUSED_CACHED = "fused_cached"
    #: Quantized inference kernels.
    QUANT = "quant"
