"""The operator console in a real browser (Debian's Chromium, driven by Playwright) against
a real server and real sandboxes: sign in, watch a sandbox appear, type into its terminal,
upload and download a file, pause and resume it from the page."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from playwright.sync_api import Browser, Page, expect

from ..browser import Watched, run_in_terminal, signed_in
from ..live import TEST_KEY, LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@pytest.fixture
def page(browser: Browser, server: LiveServer) -> Iterator[tuple[Page, Watched]]:
    with signed_in(browser, server.url, TEST_KEY) as opened:
        yield opened


def test_a_wrong_key_is_refused_and_a_signed_out_console_asks_again(
    browser: Browser, server: LiveServer
) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(server.url + "/console/")
    page.get_by_label("API key").fill("e2b_" + "0" * 40)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not accepted")
    page.get_by_label("API key").fill(TEST_KEY)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("live")).to_have_text("live")
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    context.close()


def test_a_sandbox_appears_and_its_terminal_files_and_pause_work(
    page: tuple[Page, Watched], tmp_path: Path
) -> None:
    console, watched = page
    sandbox = Sandbox.create(timeout=300)
    try:
        row = console.locator(f'[data-sandbox="{sandbox.sandbox_id}"]')
        started = time.monotonic()
        expect(row).to_be_visible(timeout=2_000)
        print(f"listed in the console {time.monotonic() - started:.2f} s after create returned")
        # Its CPU and memory use, asked for the drawn rows in one request.
        expect(row).to_contain_text("% of 1", timeout=20_000)

        row.get_by_role("link").click()
        run_in_terminal(console, "echo console-$((6 * 7))", "console-42")

        upload = tmp_path / "from-the-browser.txt"
        upload.write_text("uploaded through the console\n")
        console.get_by_test_id("upload").set_input_files(upload)
        listed = console.locator('[data-file="from-the-browser.txt"]')
        expect(listed).to_be_visible(timeout=20_000)
        assert sandbox.files.read("/home/user/from-the-browser.txt") == upload.read_text()
        with console.expect_download() as download:
            listed.click()
        assert Path(download.value.path()).read_text() == upload.read_text()

        console.get_by_role("button", name="Pause").click()
        expect(console.get_by_test_id("sandbox-state")).to_have_text("paused", timeout=60_000)
        assert Sandbox.get_info(sandbox.sandbox_id).state.value == "paused"
        console.get_by_role("button", name="Resume").click()
        expect(console.get_by_test_id("sandbox-state")).to_have_text("running", timeout=60_000)
        assert sandbox.commands.run("cat /home/user/from-the-browser.txt").stdout == (
            upload.read_text()
        )

        console.get_by_role("link", name="Metrics").click()
        for operation in ("create", "pause", "resume"):
            expect(console.locator(f'[data-operation="{operation}"]')).to_be_visible()
        expect(console.get_by_test_id("density").locator("canvas")).to_have_count(3)

        console.get_by_role("link", name="Sandboxes").click()
        console.once("dialog", lambda dialog: dialog.accept())
        row.get_by_role("button", name="Kill").click()
        expect(row).to_have_count(0, timeout=20_000)
        assert watched.problems == [], watched.problems
    finally:
        sandbox.kill()


def test_a_builds_log_is_followed_on_the_templates_page(page: tuple[Page, Watched]) -> None:
    console, watched = page
    recipe = Template().from_template("base").run_cmd("echo console-build-$((6 * 7))")
    with ThreadPoolExecutor(1) as pool:
        building = pool.submit(Template.build, recipe, "console-built", cpu_count=1, memory_mb=512)
        console.get_by_role("link", name="Templates").click()
        build = console.locator("[data-build]").filter(has_text="console-built").first
        build.get_by_role("button", name="Log").click()
        expect(console.get_by_test_id("build-log")).to_contain_text(
            "console-build-42", timeout=120_000
        )
        expect(console.get_by_test_id("build-status")).to_have_text("ready", timeout=120_000)
        building.result()
    expect(console.locator('[data-template="console-built"]')).to_be_visible(timeout=10_000)
    assert watched.problems == [], watched.problems


STEALER = """<!doctype html><title>?</title><script>
try { document.title = "read: " + sessionStorage.getItem("aenv.apiKey"); }
catch (e) { document.title = "refused: " + e.name; }
</script>"""


def test_a_guest_page_on_the_consoles_origin_cannot_read_its_key(
    page: tuple[Page, Watched],
) -> None:
    console, _ = page
    sandbox = Sandbox.create(timeout=120)
    try:
        sandbox.files.write("/home/user/site/index.html", STEALER)
        sandbox.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
        sandbox.commands.run(
            "for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/8000) 2>/dev/null && break;"
            " sleep 0.2; done"
        )
        # The same tab that holds the key, led to the guest's page by its /proxy/ path.
        console.goto(f"{console.url.split('/console')[0]}/proxy/{sandbox.sandbox_id}/8000/")
        expect(console).to_have_title("refused: SecurityError")
    finally:
        sandbox.kill()
