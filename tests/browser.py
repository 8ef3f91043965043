"""Debian's Chromium driven by Playwright, for the console's tests and benchmark: launched
for a closed network, signed in to a server's console, and watched for what the console
must never do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Request,
    Response,
    expect,
    sync_playwright,
)

CHROMIUM = "/usr/bin/chromium"
# A closed network: no background fetches to Google's hosts, no QUIC, no sandbox as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


class Watched:
    """What a page did that the console must never do: violate its policy, throw, fail a
    request, or send the API key in a URL or to a sandbox."""

    def __init__(self, page: Page, key: str) -> None:
        self.key = key
        self.problems: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"uncaught: {error}"))
        page.on("request", self._request)
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def _console(self, message: ConsoleMessage) -> None:
        if "Content Security Policy" in message.text:
            self.problems.append(f"policy: {message.text}")

    def _request(self, request: Request) -> None:
        if self.key in request.url:
            self.problems.append(f"key in a URL: {request.url}")
        headers = request.headers
        if "e2b-sandbox-id" in headers and "x-api-key" in headers:
            self.problems.append(f"key sent to a sandbox: {request.url}")

    def _failed(self, request: Request) -> None:
        # A terminal's stream ends when its sandbox pauses or its page is left.
        if not request.url.endswith("/process.Process/Start"):
            self.problems.append(f"failed: {request.method} {request.url}")

    def _response(self, response: Response) -> None:
        if response.status >= 400:
            self.problems.append(f"{response.status}: {response.request.method} {response.url}")


def sign_in(page: Page, url: str, key: str) -> None:
    """Open the console at `url` and sign in with `key`; back once its list is live."""
    page.goto(url.rstrip("/") + "/console/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("live")).to_have_text("live", timeout=10_000)


@contextmanager
def signed_in(browser: Browser, url: str, key: str) -> Iterator[tuple[Page, Watched]]:
    """A fresh context's page, signed in and watched."""
    context: BrowserContext = browser.new_context(accept_downloads=True)
    try:
        page = context.new_page()
        watched = Watched(page, key)
        sign_in(page, url, key)
        yield page, watched
    finally:
        context.close()


def run_in_terminal(page: Page, command: str, shown: str, timeout: float = 30_000) -> None:
    """On a sandbox's page: wait for its terminal, type `command` and a newline, and wait
    until the screen's text shows `shown`."""
    status = page.get_by_test_id("terminal-status")
    expect(status).to_contain_text("connected", timeout=timeout)
    page.get_by_test_id("terminal").click()
    page.keyboard.type(command + "\n")
    expect(page.locator(".xterm-rows")).to_contain_text(shown, timeout=timeout)
