import os

# Keep numba and BLAS to one thread per test worker on the 2-core machines.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
