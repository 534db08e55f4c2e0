from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.testing.embedded import EmbeddedServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    s = EmbeddedServer(tmp_path_factory.mktemp("api"), simulate=["2xV100-16GB"])
    s.start()
    try:
        yield s
    finally:
        s.cleanup()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = Path(os.environ.get("TESSERA_ARTIFACTS") or tmp_path_factory.mktemp("screens"))
    where.mkdir(parents=True, exist_ok=True)
    print(f"console screenshots: {where}")
    return where


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's Chromium, headless, through chromium-driver (./dev setup installs both)."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):  # say so instead of passing
        pytest.fail("Debian's chromium and chromium-driver are needed (./dev setup installs them)",
                    pytrace=False)
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
                 "--window-size=1280,900"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(chromedriver))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
