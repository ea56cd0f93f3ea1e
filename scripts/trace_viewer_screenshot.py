"""Screenshot of TensorBoard's profile plugin's trace viewer, every
process expanded, in headless Chromium (Debian's /usr/bin/chromium, driven
by Playwright). Run by scripts/timeline_screenshot.sh:

    python scripts/trace_viewer_screenshot.py URL OUT.png
"""

from __future__ import annotations

import sys
import time
import urllib.request

from playwright.sync_api import sync_playwright

# Chromium's own connections (updates, sync, lookups) are refused on a
# machine without a network; these flags keep it from trying.
_CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def wait_for(url: str, seconds: float = 120) -> None:
    """Until TensorBoard answers at `url` (it reads the log folder first)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def main(url: str, out: str) -> None:
    wait_for(url.split("?")[0])
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=_CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1600, "height": 2600})
        page.goto(url)
        # The trace viewer is a frame of its own, loaded after the page.
        viewer = None
        deadline = time.monotonic() + 120
        while viewer is None:
            viewer = next(
                (f for f in page.frames if "trace_viewer_index" in f.url),
                None,
            )
            if viewer is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no trace viewer at {url}")
                page.wait_for_timeout(500)
        expand = viewer.get_by_text("Expand All")
        expand.wait_for(timeout=120_000)
        page.wait_for_timeout(3000)  # The trace's events, after the rows.
        expand.click()
        page.wait_for_timeout(3000)
        page.screenshot(path=out)
        browser.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
