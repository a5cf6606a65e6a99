"""alpaviz.widgets: the visual plan editor (ipywidgets in Jupyter, panel as a web app) and the HTML report.

This module only re-exports; it reads and edits plans through core's public data model.
"""

from typing import Any

from alpaviz.widgets._editor import PlanEditor as PlanEditor
from alpaviz.widgets._open_editor import editor as editor
from alpaviz.widgets._report import ReportSection as ReportSection
from alpaviz.widgets._report import write_report as write_report
from alpaviz.widgets._session import EditorSession as EditorSession
from alpaviz.widgets._session import WhatIf as WhatIf


def serve(port: int = 5006, address: str = "127.0.0.1", num_layers: int = 4, solver=None, show: bool = False) -> Any:
    """Start the plan editor web app on `address:port` (blocking); panel is imported on first use."""
    from alpaviz.widgets._app_server import serve as serve_app  # lazy: only the web app needs panel

    return serve_app(port, address, num_layers, solver, show)


__all__ = ["editor", "EditorSession", "PlanEditor", "ReportSection", "serve", "WhatIf", "write_report"]
