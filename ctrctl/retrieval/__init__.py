"""Two-stage recommendation: two-tower retrieval over an ANN item index.

* :mod:`ctrctl.retrieval.synthetic`: interaction logs from planted user and item factors.
* :mod:`ctrctl.retrieval.index`: faiss item indexes (flat, ivf, hnsw, ivfpq) and their recall.
* :mod:`ctrctl.retrieval.evaluate`: full-ranking recall and NDCG against popularity and BPR.

The towers and the loss are in :mod:`ctrctl.modules.two_tower`; they train through
``ctrctl train`` with ``model.kind: two_tower``.
"""
