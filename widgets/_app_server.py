"""The web app's server: the default model's session, one page per browser tab, `alpaviz serve`."""

from __future__ import annotations

from typing import Any

import panel as pn

from alpaviz.core import Cluster, trace
from alpaviz.core.models import gpt
from alpaviz.widgets import _html as H
from alpaviz.widgets._app import PanelEditor
from alpaviz.widgets._session import EditorSession, WhatIf


def default_session(num_layers: int = 4, solver=None, cache: Any = None) -> EditorSession:
    """The default GPT (with `num_layers` blocks) on one 8-GPU A100 host, solved with av.solve."""
    step, params, batch = gpt(num_layers=num_layers)
    graph = trace(step, params, batch)
    return EditorSession(graph, whatif=WhatIf(4, "1f1b", Cluster.a100_node(1)), solver=solver,
                         solve_options={"cache": cache} if cache is not None else None,
                         step_fn=step, example_args=(params, batch))


def _page(make_session) -> pn.Column:
    pn.extension("plotly")
    try:
        return PanelEditor(make_session()).layout
    except ValueError as err:  # e.g. no solver in this alpaviz yet: say so on the page
        return pn.Column(pn.pane.Markdown("## alpaviz plan editor"), pn.pane.HTML(H.message_html(False, str(err))))


def create_app(num_layers: int = 4, solver=None, cache: Any = None) -> pn.Column:
    """A fresh page with its own session (solves the default model when the page opens)."""
    return _page(lambda: default_session(num_layers, solver, cache))


def serve(port: int = 5006, address: str = "127.0.0.1", num_layers: int = 4, solver=None, show: bool = False) -> Any:
    """Start the panel server on `address:port` (blocking).

    The default model is traced and solved once here; each browser tab then
    starts from that plan with its own session, a shared stage-profile cache and shared profiling processes.
    """
    try:
        first = default_session(num_layers, solver)
    except ValueError as err:  # no first plan: every page says why
        reason = str(err)

        def fresh() -> EditorSession:
            raise ValueError(reason)
    else:
        # every page shares the first session's profiling processes (started if its solve was slow), not its own
        shared = first.workers.pool

        def fresh() -> EditorSession:
            options = {"cache": first.cache} if shared is None else {"cache": first.cache, "workers": shared}
            return EditorSession(first.graph, first.plan, whatif=first.whatif, solver=first.solver,
                                 solve_options=options, step_fn=first.step_fn, example_args=first.example_args,
                                 background_workers=0)

    return pn.serve(lambda: _page(fresh), port=port, address=address, show=show,
                    websocket_origin=[f"{address}:{port}", f"localhost:{port}"], title="alpaviz plan editor")


if __name__.startswith("bokeh"):  # `panel serve widgets/_app_server.py`
    create_app().servable()
