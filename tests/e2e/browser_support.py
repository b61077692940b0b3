"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium.

``scripts/browser_deps.sh`` installs both; ``.ci/run`` calls it. Outside CI a machine without
them skips the browser tests (and says so); in CI (``CI=true``) a missing browser fails them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from engram_testing import tool_missing

PHONE_WIDTH = 320
DESKTOP = (1280, 900)


def chromium_paths() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def open_chromium(*extra_flags: str) -> Iterator[webdriver.Chrome]:
    found = chromium_paths()
    if found is None:
        reason = "no Chromium and chromedriver on PATH (install: scripts/browser_deps.sh)"
        tool_missing(reason)
    browser, driver_path = found
    options = Options()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
        *extra_flags,
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def as_desktop(driver: webdriver.Chrome) -> None:
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    driver.set_window_size(*DESKTOP)


def as_phone(driver: webdriver.Chrome) -> None:
    """A 320 px wide phone (CSS pixels), as Chrome's device emulation draws it."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": PHONE_WIDTH, "height": 640, "deviceScaleFactor": 2, "mobile": True},
    )


def full_screenshot(driver: webdriver.Chrome, path: Path) -> Path:
    """The whole page (not only the viewport) as a PNG."""
    import base64

    shot: dict[str, Any] = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    path.write_bytes(base64.b64decode(shot["data"]))
    return path


def page_width(driver: webdriver.Chrome) -> int:
    width: int = driver.execute_script("return document.documentElement.scrollWidth")
    return width


def text_of(driver: webdriver.Chrome, css: str) -> list[str]:
    return [element.text for element in driver.find_elements(By.CSS_SELECTOR, css)]
