"""Command line: `python -m alpaviz demo`, `python -m alpaviz serve` and `python -m alpaviz calibrate`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys


def _use_virtual_cpu_devices(count: int) -> None:
    """Ask XLA for `count` CPU devices; effective until the first JAX computation."""
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


def load_solver(spec: str | None):
    """`"package.module:function"` -> that function; None -> av.solve."""
    if spec is None:
        return None
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--solver takes module:function, got {spec!r}")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="alpaviz", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="auto-parallelize the default GPT and write an HTML report")
    demo.add_argument("--devices", type=int, default=8, help="virtual CPU devices for the launch")
    demo.add_argument("--report", default="demo_report.html", help="where to write the report")
    serve = sub.add_parser("serve", help="start the plan editor web app (panel) on localhost")
    serve.add_argument("--port", type=int, default=5006)
    serve.add_argument("--address", default="127.0.0.1")
    serve.add_argument("--layers", type=int, default=4, help="GPT blocks of the default model")
    serve.add_argument("--solver", default=None, help="module:function to use instead of av.solve")
    calibrate = sub.add_parser("calibrate", help="measure (or read the cached) figures of this machine's devices")
    calibrate.add_argument("--devices", type=int, default=8, help="virtual CPU devices to measure")
    calibrate.add_argument("--refresh", action="store_true", help="measure again instead of reading the cache")
    args = parser.parse_args(argv)
    _use_virtual_cpu_devices(getattr(args, "devices", 8))
    # lazy: each command imports only its own stack (JAX for the demo, the UI for serve)
    if args.command == "demo":
        from alpaviz._demo import run_demo

        return run_demo(devices=args.devices, report_path=args.report)
    if args.command == "calibrate":
        from alpaviz.core.cost import calibrate as measure  # lazy: see above

        print(measure(refresh=args.refresh).describe())
        return 0
    if args.command == "serve":
        from alpaviz.widgets import serve as serve_app  # lazy: see above

        serve_app(args.port, args.address, args.layers, load_solver(args.solver))
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
