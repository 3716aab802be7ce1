import os
import sys

# Keep numba and BLAS to one thread per test worker on the 2-core machines.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

# Amaranth's simulator compiles wide expressions recursively (16 lanes of the parser);
# under pytest-xdist the worker's own frames sit below them.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))
