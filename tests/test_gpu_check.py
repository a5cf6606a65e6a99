"""benchmarks/gpu_check.py, the one-command model check for a GPU host, runs whole on CPU with tiny sizes."""

import importlib.util
import pathlib
import re

SCRIPT = pathlib.Path(__file__).parent.parent / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(text: str, header: str) -> list[list[str]]:
    """The body rows of the Markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_gpu_check_prints_every_table_with_figures(capsys):
    assert _load().main(["--hidden", "64", "--heads", "2", "--seq", "32", "--batch", "4", "--layers", "2",
                         "--matmul", "128", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    figures = dict(_rows(out, "| figure |"))
    assert {"matmul f32 TFLOP/s", "matmul bf16 TFLOP/s", "launch us"} <= figures.keys()
    assert all(float(v) > 0 for k, v in figures.items() if not k.startswith("calibrate(): all-reduce"))
    blocks = _rows(out, "| dtype | pass |")
    assert [(r[0], r[1]) for r in blocks] == [("fp32", "forward"), ("fp32", "backward"),
                                             ("bf16", "forward"), ("bf16", "backward")]
    assert all(float(r[2]) > 0 and float(r[3]) >= 0 for r in blocks)
    (memory,) = _rows(out, "| predicted | XLA memory_analysis |")
    # XLA's program needs about what the memory model predicts (a broken model is off by far more)
    assert 0.5 <= float(memory[2]) <= 2.0 and memory[3].startswith("n/a")
    (step,) = _rows(out, "| predicted | av.parallelize |")
    assert all(float(v) > 0 for v in step)
    assert re.search(r"gpu_check on cpu", out)
