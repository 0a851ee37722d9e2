"""A picture of the HTML report of a run, taken in headless Chromium: the docs' screenshot.

    python tools/html_screenshot.py RUN.jsonl docs/img/html_report.png [--base BASE.jsonl]

It writes the page with ``python -m instrument html`` into a temporary folder, opens it in
Debian's headless Chromium through selenium (``/usr/bin/chromium`` and
``/usr/bin/chromedriver``, as the browser tests use) at 1200 x 1500 pixels, and saves what
the window shows as a PNG. The page names the run by its file's base name, so no folder of
this machine shows in the picture.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from instrument import cli

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def screenshot(page: Path, out: Path, width: int, height: int) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    profile = tempfile.mkdtemp(prefix="instrument-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--user-data-dir={profile}", f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(page.as_uri())
        WebDriverWait(driver, 20).until(
            lambda d: d.execute_script("return document.body.dataset.ready === '1'")
        )
        driver.save_screenshot(str(out))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a JSONL file written by instrument.sinks.JSONL")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--base", type=Path, help="a baseline run: adds the diff")
    parser.add_argument("--size", default="1200x1500", help="the window, WIDTHxHEIGHT")
    args = parser.parse_args()
    width, _, height = args.size.partition("x")
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "report.html"
        base = ["--base", str(args.base)] if args.base else []
        code = cli.main(["html", str(args.run), "-o", str(page), *base])
        if code:
            return code
        screenshot(page, args.out, int(width), int(height))
    print(f"wrote {args.out} ({args.out.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
