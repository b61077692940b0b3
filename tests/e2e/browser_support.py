"""Headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium.

``scripts/browser_deps.sh`` installs both; ``.ci/run`` calls it. Outside CI a machine without
them skips the browser tests (and says so); in CI (``CI=true``) a missing browser fails them.
"""

from __future__ import annotations

import os
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


def as_width(driver: webdriver.Chrome, width: int, height: int = DESKTOP[1]) -> None:
    """A desktop window ``width`` CSS pixels wide (the viewport, not the window's frame)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def screenshots_dir(factory: Any, name: str) -> Path:
    """Where a module's screenshots go: ``ENGRAM_SCREENSHOTS`` when set (kept for a person to
    look at), else a temporary folder (``factory``: pytest's ``tmp_path_factory``)."""
    kept = os.environ.get("ENGRAM_SCREENSHOTS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    path: Path = factory.mktemp(name)
    return path


# Every laid-out element that sticks out of the viewport's right edge or whose content is wider
# than its box (inside an SVG only the SVG itself counts).
_OVERFLOWING = """
const out = [];
for (const el of document.querySelectorAll('body *')) {
  if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') continue;
  const box = el.getBoundingClientRect();
  if (box.width === 0 && box.height === 0) continue;
  const wide = el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1;
  if (box.right > window.innerWidth + 0.5 || wide) {
    out.push(`${el.tagName}#${el.id}.${el.className}: right ${Math.round(box.right)},`
      + ` content ${el.scrollWidth} in ${el.clientWidth}`);
  }
}
return out;
"""

# Every word of the text under the elements ``arguments[0]`` selects (outside <code>: ids and
# digests may break) that is laid out on more than one line.
_BROKEN_WORDS = r"""
const broken = [];
for (const root of document.querySelectorAll(arguments[0])) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (node.parentElement.closest('code')) continue;
    for (const word of node.data.matchAll(/[^\s\u2010-\u2014-]+/g)) {
      const range = document.createRange();
      range.setStart(node, word.index);
      range.setEnd(node, word.index + word[0].length);
      const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (tops.size > 1) broken.push(word[0]);
    }
  }
}
return broken;
"""


def overflowing(driver: webdriver.Chrome) -> list[str]:
    """The elements of the page that do not fit across (empty when everything fits)."""
    found: list[str] = driver.execute_script(_OVERFLOWING)
    return found


def broken_words(driver: webdriver.Chrome, css: str) -> list[str]:
    """The words under ``css`` that wrap in the middle (empty when every word is whole)."""
    found: list[str] = driver.execute_script(_BROKEN_WORDS, css)
    return found


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
