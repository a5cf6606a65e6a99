"""alpaviz.widgets: the visual plan editor (ipywidgets in Jupyter, panel as a web app).

This module only re-exports; it reads and edits plans through core's public data model.
"""

from alpaviz.widgets._editor import PlanEditor as PlanEditor
from alpaviz.widgets._editor import editor as editor
from alpaviz.widgets._session import EditorSession as EditorSession
from alpaviz.widgets._session import WhatIf as WhatIf

__all__ = ["PlanEditor", "editor", "EditorSession", "WhatIf"]
