"""One real-browser smoke test: `python -m viewer view` on the samples, driven by headless Chromium.

Waits for the Runs page to finish analysing (it polls), ticks two runs, follows Compare, and
checks that the timeline, breakdown and memory graphs were drawn with data. Then zooms the
timeline and checks the server re-binned it. Saves test-artifacts/viewer-compare.png (and
-zoomed.png). A second test opens Compare of the ddp and fsdp samples directly and checks that the
Findings card comes first with at least one finding's sentence (red until the findings rules
fire on the samples: profiler/findings.py), then Theory vs measured; in the same browser it then
loads the Plan page, presses Plan with the default model and checks the ranked table and both
figures were drawn (test-artifacts/viewer-plan.png). Needs Debian's `chromium` and `chromium-driver` (installed by .ci/run); skipped
where they are absent, except on CI (CI set in the environment), where a missing browser is a
failure rather than a silent skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import REPO

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
ARTIFACTS = REPO / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"), reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def server(traces_root, tmp_path):
    """(url, log file) of `python -m viewer view` on the samples."""
    port = _free_port()
    log = tmp_path / "viewer.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "viewer", "view", "--traces", str(traces_root), "--port", str(port)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"viewer exited: {log.read_text()}")
                time.sleep(0.1)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture()
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1500,2400"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    yield driver
    driver.quit()


def _bars(driver, graph_id: str) -> int:
    """Drawn bar/line paths with a non-empty shape inside one dcc.Graph."""
    return driver.execute_script(
        "const g = document.getElementById(arguments[0]); if (!g) return 0;"
        "return [...g.querySelectorAll('g.trace path')].filter(p => (p.getAttribute('d') || '').length > 5).length;",
        graph_id,
    )


def test_compare_two_runs_in_a_browser(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    from viewer import ids

    url, log = server
    wait = WebDriverWait(browser, 40)
    browser.get(url + "/")
    # The table shows at once and fills in as the runs are analysed in the background.
    wait.until(EC.presence_of_element_located((By.XPATH, "//td[@data-dash-column='run']")))
    WebDriverWait(browser, 180).until(EC.text_to_be_present_in_element((By.ID, ids.RUNS_PROGRESS), " runs."),
                                      message="the analyses never finished")
    for run in ("sample-ddp-2r", "sample-fsdp-2r"):
        row = wait.until(EC.presence_of_element_located((By.XPATH, f"//tr[td[@data-dash-column='run'][.//*[text()='{run}'] or text()='{run}']]")))
        row.find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    link = wait.until(lambda d: d.find_element(By.ID, ids.RUNS_COMPARE_LINK) if "disabled" not in
                      d.find_element(By.ID, ids.RUNS_COMPARE_LINK).get_attribute("class") else None)
    link.click()
    wait.until(EC.url_contains("/compare?runs="))
    for graph in (ids.COMPARE_TIMELINE, ids.COMPARE_BREAKDOWN, ids.COMPARE_MEMORY):
        wait.until(lambda d, g=graph: _bars(d, g) > 0, message=f"{graph} drew nothing")
    assert _bars(browser, ids.COMPARE_TIMELINE) > 20  # lanes of both runs, not one stray bar
    titles = browser.execute_script(
        f"return [...document.querySelectorAll('#{ids.COMPARE_TIMELINE} .gtitle, #{ids.COMPARE_TIMELINE} .annotation-text')].map(e => e.textContent)")
    assert {"sample-ddp-2r", "sample-fsdp-2r"} <= set(titles)
    assert not browser.find_elements(By.CSS_SELECTOR, ".error")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "viewer-compare.png"))

    # Zoom to 1 ms: the server re-bins that range and, with few events in it, sends them by name.
    browser.execute_script(
        "const gd = document.querySelector(arguments[0]); Plotly.relayout(gd, {'xaxis.range[0]': 2, 'xaxis.range[1]': 3});",
        f"#{ids.COMPARE_TIMELINE} .js-plotly-plot",
    )
    hover = (f"const gd = document.querySelector('#{ids.COMPARE_TIMELINE} .js-plotly-plot');"
             "return gd.data.flatMap(t => t.hovertext || []).filter(h => h.startsWith('aten::')).length;")
    wait.until(lambda d: d.execute_script(hover) > 0, message="zooming in did not bring operator names")
    x_range = browser.execute_script(f"return document.querySelector('#{ids.COMPARE_TIMELINE} .js-plotly-plot').layout.xaxis.range")
    assert [round(v, 3) for v in x_range] == [2, 3]
    time.sleep(1)
    calls = log.read_text().count("_dash-update-component")
    time.sleep(2)
    assert log.read_text().count("_dash-update-component") == calls, "the timeline keeps re-rendering itself"
    browser.save_screenshot(str(ARTIFACTS / "viewer-compare-zoomed.png"))


def test_findings_card_comes_first_with_text(server, browser):
    """Compare of the ddp and fsdp samples: the first card is Findings, holding at least one finding
    with a sentence (not the "no findings" line), and Theory vs measured follows it, not blank."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from viewer import ids

    url, _log = server
    browser.get(url + "/compare?runs=sample-ddp-2r,sample-fsdp-2r")
    answered = (f"#{ids.COMPARE_FINDINGS} li.finding, #{ids.COMPARE_FINDINGS} .no-findings, "
                f"#{ids.COMPARE_FINDINGS} .warning, #{ids.COMPARE_FINDINGS} .error")
    WebDriverWait(browser, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, answered), message="the Findings card never filled in")
    cards = browser.find_elements(By.CSS_SELECTOR, ".page > .card, .page > .row > .card")
    assert [c.find_element(By.TAG_NAME, "h3").text for c in cards[:2]] == ["Findings", "Theory vs measured"]
    assert cards[0].find_elements(By.ID, ids.COMPARE_FINDINGS)
    sentences = [e.text.strip() for e in browser.find_elements(By.CSS_SELECTOR, f"#{ids.COMPARE_FINDINGS} li.finding .finding-text")]
    card = browser.find_element(By.ID, ids.COMPARE_FINDINGS).text
    assert sentences and all(len(s) > 10 for s in sentences), f"no findings with text; the card says: {card!r}"
    WebDriverWait(browser, 60).until(lambda d: d.find_element(By.ID, ids.COMPARE_THEORY).text.strip() not in ("", "loading…"),
                                     message="the Theory vs measured card stayed blank")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "viewer-findings.png"))
    _plan_page_draws(browser, url)


def _plan_page_draws(browser, url: str) -> None:
    """One more page load in the same browser (no session of its own): /plan, press Plan with the
    default model (GPT-3 XL 1.3B on 8 GPUs), and see the ranked table and both figures drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from viewer import ids

    browser.get(url + "/plan")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, ids.PLAN_BUTTON)).pop().click()
    answered = f"#{ids.PLAN_TABLE} td[data-dash-column='layout'], #{ids.PLAN_RESULT} .error"
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, answered), message="the Plan page never answered")
    assert not browser.find_elements(By.CSS_SELECTOR, f"#{ids.PLAN_RESULT} .error"), browser.find_element(By.ID, ids.PLAN_RESULT).text
    layouts = [e.text for e in browser.find_elements(By.CSS_SELECTOR, f"#{ids.PLAN_TABLE} td[data-dash-column='layout']")]
    assert layouts and all(t.startswith("dp=") for t in layouts)
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script(f"return document.querySelectorAll('#{ids.PLAN_RESULT} .js-plotly-plot g.trace.bars').length") >= 2,
        message="the Plan figures drew no bars")
    browser.save_screenshot(str(ARTIFACTS / "viewer-plan.png"))
