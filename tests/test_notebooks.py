"""Every notebook in notebooks/ runs end to end in a kernel of this environment."""

import pathlib
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3, f"expected the three tutorial notebooks, found {NOTEBOOKS}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
        f"{path.name} has committed outputs; clear them (outputs are produced by the test run)"
    )
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        out for cell in nb.cells if cell.cell_type == "code"
        for out in cell.get("outputs", []) if out.get("output_type") == "error"
    ]
    assert not errors
    # Exported to HTML, as a reader without a kernel sees it: every figure drawn, the editor as a snapshot.
    # As `make notebooks-html` exports them: the widget state is cleared, so the editor shows its snapshot.
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    page, _ = HTMLExporter(config=Config({"ClearMetadataPreprocessor": {"enabled": True}})).from_notebook_node(nb)
    figures = sum(1 for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
                  if "application/vnd.plotly.v1+json" in out.get("data", {}))
    assert page.count('class="plotly-graph-div"') >= figures, f"{figures} figures, not all drawn"
    assert figures or path.stem.startswith("02"), "notebooks 01 and 03 draw plotly figures"
    if "av.editor(" in "".join(cell.source for cell in nb.cells):
        assert "a static snapshot: run the notebook to edit" in page and ">step time<" in page
    assert len(page) < 12e6, f"{path.name} exports to {len(page) / 1e6:.1f} MB of HTML"
