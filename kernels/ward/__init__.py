"""Ward agglomerative clustering of many small point sets at once: the merges behind token
pooling (:func:`mvdb.pool`).

Each set (a document's tokens) comes as its matrix of distances, padded to a power of two with
``inf`` (and ``inf`` on the diagonal), with each row's nearest column. Clusters merge greedily,
closest pair first, the distance of a merged cluster to every other following SciPy's Ward update
(Lance-Williams, in float64, in SciPy's order of operations), until ``n - k`` merges are done:
Ward's linkage is monotone, so that is the partition of SciPy's ``fcluster(linkage(d, "ward"), k,
"maxclust")`` except on exact ties. The answer is each point's cluster, named by one of its points.
Layout: ``naive.py`` (torch: every set's merge a step, the reference and the CPU path), ``fused.py``
(the Triton kernel: one program a set, all its merges in one launch), ``ops.py`` (the public function).
"""

from mvdb.kernels.ward.ops import merge

__all__ = ["merge"]
