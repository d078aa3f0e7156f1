"""The notebooks run top to bottom (nbclient, from the repository root) and are committed without outputs."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01-quickstart.ipynb", "02-sweep-and-pareto.ipynb",
                                           "03-calibration.ipynb", "04-compare-accelerators.ipynb", "05-moe.ipynb",
                                           "06-time-to-train.ipynb", "07-validation.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


# 03 runs from notebooks/ on the saved calibration results: test_notebook_calibration.py.
@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem != "03-calibration"], ids=lambda p: p.stem)
def test_notebook_executes(path):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == []
    plotting = [c for c in nb.cells if c.cell_type == "code" and ("plt.subplots(" in c.source or ".plot(" in c.source
                or ".plot." in c.source or (
                "plots." in c.source and any(f"plots.{k}(" in c.source for k in (
                    "memory", "pareto", "heatmap", "breakdown", "timeline", "scatter", "accelerators"))))]
    assert plotting, "the notebook draws nothing"
    for cell in plotting:  # each figure shows inline, once
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert len(images) == 1, cell.source
