"""The CPU back end under the op kernels: what numba alone does not give.

    lanes.py           row sums, maxima and dot products in one LLVM vector of
                       fixed partial sums (the same bits on every compile)
    register_tiles.py  small and packed matrix products with the output tile in
                       vector registers (attention's products, narrow BLAS's)
    blas_gemm.py       BLAS's sgemm/dgemm called from inside numba kernels
    prefetch.py        a hint to fetch rows ahead of use
    streaming.py       stores that bypass the caches, for data read much later
    llvm_loops.py      one counted loop in LLVM IR, shared by lanes and tiles

None of these changes a result: the arithmetic and its order are written
out. README.md holds the measurements behind each choice.
"""
