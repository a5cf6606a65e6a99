"""The panel app in a real Chromium: pin a stage cut by clicking, Re-solve, read the new plan back.

`make test` installs Chromium from Debian (`make browser-deps`); when it is
missing this test fails with that instruction instead of skipping.
"""

import contextlib
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = pathlib.Path(__file__).parent.parent / "artifacts"
BROWSER_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"]
pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, server: subprocess.Popen, log: pathlib.Path, timeout_s: float = 240.0) -> None:
    """Wait until the server listens (it traces and solves the model first); a connect opens no page."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the panel app exited with code {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"the panel app did not listen on port {port} within {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def app_url():
    """One server for the module: every page it serves opens its own session on the first plan."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make browser-deps` (apt-get install -y chromium) for the browser test")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("Playwright's Python client is missing: pip install -e '.[test]' (no browser download needed)")
    port = _free_port()
    command = [sys.executable, "-m", "alpaviz", "serve", "--port", str(port), "--layers", "4"]  # av.solve plans
    env = dict(os.environ)
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "browser_server.log"
    with open(log, "w") as out:  # a file, not a pipe: a full pipe would stall the server
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, server, log)
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _cuts(text: str) -> set[int]:
    match = re.search(r"cuts at layers: ([\d, ]+|none)", text)
    assert match, f"no plan headline in {text!r}"
    return set() if match.group(1) == "none" else {int(c) for c in match.group(1).split(",")}


@contextlib.contextmanager
def _app_page(url: str, width: int, height: int):
    """The app open in Chromium at `width` x `height`, once its first plan is shown; on leaving, no error may
    have reached the browser's console or escaped the page's scripts."""
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.goto(url, timeout=120_000)
            page.get_by_text("cuts at layers").wait_for(timeout=120_000)
            yield page
        finally:
            browser.close()
    assert not errors, errors


def _tab(page, title: str) -> None:
    page.locator(".bk-tab").filter(has_text=re.compile(rf"^{title}$")).click()
    page.wait_for_timeout(500)


def _submeshes(text: str) -> list[str]:
    match = re.search(r"\(submeshes ([^)]*)\)", text)
    assert match, f"no submeshes in {text!r}"
    return match.group(1).split("; ")


def test_pin_a_cut_in_the_browser_and_resolve(app_url):
    with _app_page(app_url, 1300, 1800) as page:
        headline = page.get_by_text("cuts at layers")
        before = _cuts(headline.inner_text())
        free = sorted(set(range(1, 4)) - before)
        # pin a cut in a gap the plan does not cut; if it cuts every gap, click on to pin a no-cut
        gap, states = (free[0], ["pinned cut"]) if free else (2, ["pinned cut", "pinned no-cut"])
        for state in states:  # each click's state is read back before the next click
            page.get_by_role("button", name=re.compile(rf"^gap {gap - 1}\|{gap} ")).click()
            page.get_by_text(f"gap before layer {gap}: {state}").wait_for(timeout=30_000)
        clicks = len(states)
        page.get_by_role("button", name="Re-solve").click()
        page.get_by_text(re.compile(r"^re-solved in")).wait_for(timeout=60_000)
        after = _cuts(headline.inner_text())
        page.wait_for_timeout(1000)  # let plotly finish drawing for the screenshot
        page.screenshot(path=str(ARTIFACTS / "browser_editor.png"), full_page=True)
        _tab(page, "Why this plan")
        shown = page.locator("pre.alpaviz-plan-text").text_content()
    assert (gap in after) == (state == "pinned cut") and (gap in before) != (gap in after), (
        f"pinned {state} before layer {gap}; cuts before {sorted(before)}, after {sorted(after)}")
    # the notebook editor, given the same clicks on the same model, presents the same view
    from alpaviz.widgets import PlanEditor
    from alpaviz.widgets._app_server import default_session
    from alpaviz.widgets._editor_view import view_text

    ed = PlanEditor(default_session(4))
    for _ in range(clicks):
        ed.cut_buttons[gap].click()
    ed.resolve_button.click()
    for section in ("headline", "cuts", "stages", "whatif", "selection", "diff"):  # the ones without seconds
        assert view_text(ed.controller.view(), (section,)) in shown, (section, shown)


def test_every_tab_draws_its_view_and_the_header_stays_above_the_fold(app_url):
    with _app_page(app_url, 1400, 900) as page:
        header = page.get_by_text("throughput", exact=True)
        box = header.bounding_box()
        assert box is not None and box["y"] + box["height"] < 900, f"the header sits at {box}"
        page.get_by_text(re.compile(r"^[\d.]+ TFLOP/s$")).first.wait_for(timeout=10_000)
        drawn = {}
        for title in ("Stages", "Graph", "Sharding", "Timeline", "Cost", "Why this plan"):
            _tab(page, title)
            plots = page.locator(".js-plotly-plot")
            drawn[title] = [plots.nth(i).locator(".gtitle").first.text_content() or ""
                            for i in range(plots.count()) if plots.nth(i).is_visible()]
            if title == "Sharding":
                page.get_by_text(re.compile(r"^stage \d+: ")).first.wait_for(timeout=10_000)
            if title == "Why this plan":
                page.get_by_role("button", name="Compare").click()
                page.get_by_text("bubble ms").wait_for(timeout=120_000)
            page.screenshot(path=str(ARTIFACTS / f"browser_tab_{title.split()[0].lower()}.png"))
    assert len(drawn["Stages"]) == 1 and len(drawn["Graph"]) == 2, drawn  # the cluster map; layer bars and graph
    assert drawn["Stages"][0].startswith("where each stage runs") and drawn["Graph"][0].startswith("layers: ")
    assert drawn["Graph"][1].startswith("operator graph")
    assert drawn["Timeline"] == ["pipeline timeline"] and drawn["Cost"][0].startswith("step "), drawn
    assert len(drawn["Sharding"]) == 1 and " on stage " in drawn["Sharding"][0], drawn  # the tensor picture
    assert drawn["Why this plan"] == [], drawn


def test_pin_a_submesh_and_a_strategy_run_a_whatif_and_launch_and_each_changes_the_views(app_url):
    with _app_page(app_url, 1400, 900) as page:
        headline = page.get_by_text("cuts at layers")
        # a submesh: pick one for stage 0 other than the solver's, re-solve, read it back
        first = _submeshes(headline.inner_text())[0]
        select = page.get_by_label("stage 0 submesh")
        labels = select.evaluate("e => Array.from(e.options).map(o => o.text)")
        wanted = next(label for label in labels[1:] if not label.startswith(f"{first} "))
        select.select_option(wanted)
        page.get_by_text(re.compile(r"^pinned stage 0's submesh")).wait_for(timeout=30_000)
        page.get_by_role("button", name="Re-solve").click()
        page.get_by_text(re.compile(r"^re-solved in")).wait_for(timeout=60_000)
        submeshes = _submeshes(headline.inner_text())
        assert submeshes[0] == wanted.split(" as ")[0]
        # a strategy: find a matmul of a stage of several devices by its line in the model code, pin another
        # strategy, re-solve
        stage = next(i for i, mesh in enumerate(submeshes) if mesh != "1x1")
        _tab(page, "Sharding")
        box = page.get_by_role("textbox", name=re.compile(r"^operator \(type"))
        box.fill("")
        box.press_sequentially("attention", delay=20)
        item = page.get_by_text(re.compile(rf"^attention .* · dot_general · n\d+_dot_general \(stage {stage}\)$")).first
        label = item.text_content()
        item.click()
        page.wait_for_timeout(500)
        assert box.input_value() == label
        node = re.search(r"(n\d+_dot_general)", label).group(1)
        strategy = page.get_by_label("strategy")
        options = strategy.evaluate("e => Array.from(e.options).map(o => [o.text, o.value])")
        assert options[0][0].startswith("(solver's choice: ")
        chosen = next(text.split(": ")[0] for text, _ in options[1:] if not options[0][0].endswith(f" {text.split(': ')[0]})"))
        strategy.select_option(label=next(text for text, _ in options if text.startswith(chosen + ": ")))
        page.get_by_text(re.compile(rf"^pinned {node}'s strategy")).wait_for(timeout=30_000)
        page.get_by_role("button", name="Re-solve").click()
        page.get_by_text(re.compile(r"^re-solved in")).wait_for(timeout=60_000)
        assert strategy.evaluate("e => e.options[0].text") == f"(solver's choice: {chosen})"  # the plan has it
        _tab(page, "Why this plan")
        page.get_by_role("cell", name="operator strategies").wait_for(timeout=10_000)
        # a what-if: twice the microbatches re-solves at once
        microbatches = page.get_by_label("microbatches")
        count = int(microbatches.input_value())
        microbatches.fill(str(2 * count))
        microbatches.press("Enter")
        page.get_by_text(re.compile(rf"^\w+ x {2 * count}$")).wait_for(timeout=60_000)  # the diff's schedule row
        # Launch: the timeline gains the measured run
        page.get_by_role("button", name="Launch").click()
        page.get_by_text(re.compile(r"^launched \d+ steps")).wait_for(timeout=240_000)
        _tab(page, "Timeline")
        page.get_by_text(re.compile(r"^measured on this machine")).wait_for(timeout=10_000)
        page.wait_for_timeout(1000)
        page.screenshot(path=str(ARTIFACTS / "browser_after_launch.png"))
