import os
import sys

import pytest

# Keep numba and BLAS to one thread per test worker on the 2-core machines.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

# Amaranth's simulator compiles wide expressions recursively (16 lanes of the parser);
# under pytest-xdist the worker's own frames sit below them.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "deep: a check too long for make test's 25 minutes on 2 cores (the aggregator's "
        "bounded model checks, the core in amaranth.sim, the native sources under the "
        "sanitizers, the wheel); `make deep` runs them, and CI runs both",
    )


@pytest.fixture
def netns_ready() -> None:
    """Network namespaces can be made here, or the test fails saying how to fix it (root,
    iproute2). The one way out is the README's OPTIREDUCE_NO_NETNS=1, which says this
    machine never can (issue: multi-host tests); then the test skips and says so."""
    from optireduce.experiments.netns import NO_NETNS_VAR, NetnsError, check_netns

    if os.environ.get(NO_NETNS_VAR) == "1":
        pytest.skip(f"{NO_NETNS_VAR}=1: this machine cannot make network namespaces")
    try:
        check_netns()
    except NetnsError as e:
        pytest.fail(str(e))
