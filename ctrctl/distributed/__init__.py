"""Sharded embeddings across processes: sharding types, DistributedModelParallel, planner."""
