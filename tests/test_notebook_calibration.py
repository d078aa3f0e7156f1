"""notebooks/03-calibration.ipynb executes (committed without outputs) on the saved results."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent


def test_calibration_notebook_executes(monkeypatch):
    monkeypatch.delenv("LLMSIM_NB_LIVE", raising=False)
    path = ROOT / "notebooks" / "03-calibration.ipynb"
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "MAPE" in text
