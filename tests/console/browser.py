"""A live console for the browser tests: uvicorn on a free loopback port in a
thread, and headless Chromium driven through the system's chromedriver."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from shardkeeper.testing.faults import wait_until

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def live_server(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a port the OS picks); yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 15, message="uvicorn did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@contextmanager
def chromium(profile: Path, size: tuple[int, int] = (1400, 1000)) -> Iterator[webdriver.Chrome]:
    """Headless Chromium (the Debian packages chromium and chromium-driver)."""
    driver_path = shutil.which("chromedriver")
    if driver_path is None or not Path(CHROMIUM).exists():
        raise RuntimeError(
            "the browser tests need chromium and chromium-driver: run make system-deps"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # the tests may run as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={size[0]},{size[1]}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
