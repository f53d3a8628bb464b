"""The viewer's pages in a real headless Chromium (Debian's `chromium` and its `chromedriver`, driven by selenium),
as fixtures (a plugin: tests/conftest.py) and the helpers that read a page as a person would.

One browser per test process (`_chromium`, started on first use); each test gets it on a blank page with the
console log read empty (`browser`). Skipped with the install line when Chromium or selenium is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="session")
def _chromium() -> Iterator[Any]:
    if not (CHROMIUM and DRIVER):
        pytest.skip("chromium and chromedriver are not installed (.ci/setup installs them: "
                    "apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")
    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium look for a driver online
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=DRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(_chromium: Any) -> Any:
    """The test process's browser on a blank page, its console log read (so `console_errors` is this test's)."""
    _chromium.get("about:blank")
    _chromium.get_log("browser")
    return _chromium


def open_page(driver: Any, path: Path, hash_: str = "") -> None:
    driver.get(path.as_uri() + hash_)
    ready = driver.execute_script("return document.body.dataset.ready")
    assert ready == "1", "the viewer's script did not finish"


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def go(driver: Any, hash_: str) -> None:
    driver.execute_script("location.hash = arguments[0]", hash_)


def choose(driver: Any, select_id: str, value: str) -> None:
    # optional package: the browser fixture skips without it
    from selenium.webdriver.support.select import Select

    Select(driver.find_element("id", select_id)).select_by_value(value)


def rows(driver: Any) -> list[list[str]]:
    """The explorer's rows on screen (one page of them unless "all" rows per page is chosen)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#rows tr')].map(tr => [...tr.cells].map(td => td.textContent))")
