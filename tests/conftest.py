"""Every test runs JAX on 8 virtual CPU devices; the flags must be set before jax is imported.

The tests' programs are small, so LLVM's optimisation of XLA's CPU code costs more than it saves: level 0
keeps XLA's own HLO passes (fusion, sharding, buffer assignment, what the tests check) and cuts compile time
by about 40 %. Child processes (profiling workers, Ray actors, notebook kernels) inherit both flags.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# The slowest files, slowest first (`--durations=0`, two workers, this machine). `make test` hands each
# file whole to one of two workers in collection order (`--dist loadfile --no-loadscope-reorder`), so
# starting with the longest lets the short files fill in and both workers finish together.
SLOWEST_FIRST = (
    "tests/test_user_code.py",
    "tests/test_notebooks.py",
    "tests/widgets/test_browser.py",
    "tests/test_microbatch_exactness.py",
    "tests/runtime/test_runtime.py",
    "tests/runtime/test_interleaved.py",
    "tests/graph/test_scan.py",
    "tests/widgets/test_widgets.py",
    "tests/inter_op/test_profile_cache.py",
    "tests/widgets/test_session_workers.py",
    "tests/inter_op/test_remat.py",
    "tests/runtime/test_zero_bubble.py",
    "tests/intra_op/test_memory.py",
)


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: files keep their order
