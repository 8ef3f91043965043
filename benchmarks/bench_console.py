"""The operator console in Debian's Chromium against a control plane of hollow nodes (the
node's code over machines that start no guest), as the fleet grows.

For each fleet size, side by side in one run:
- first contentful paint of the sign-in page in a fresh browser context, and the bytes
  the page and its assets took on the wire (gzipped);
- the list drawn: from the stream's whole list arriving to the frame that shows it
  (`data-drawn-ms`); only a window of rows is drawn, so 40, 1,000 and 10,000 sandboxes
  should cost about the same;
- a scroll to the list's end: to the frame showing its last row;
- a create through the API until its row shows in an open console (the stream reads
  once a second).

Prints JSON lines. Run: `python -m benchmarks.bench_console [--sizes 40,1000,10000]
[--hollow 10]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from playwright.sync_api import Page, expect

from agentenv.cluster.local import ClusterState, LocalCluster
from tests.browser import chromium, sign_in

from .bench_control_scale import ENV, HOLLOW_ENV, Load, populate

T = TypeVar("T")
# Creates in flight while populating, through the control plane.
WORKERS = 16

PAINT = "performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? null"
WIRE_BYTES = """[...performance.getEntriesByType('navigation'),
                 ...performance.getEntriesByType('resource')]
    .filter(e => new URL(e.name).pathname.startsWith('/console'))
    .reduce((sum, e) => sum + e.transferSize, 0)"""
SCROLL_TO_END = """async () => {
    const rows = document.querySelector('[data-testid=sandbox-rows]');
    const began = performance.now();
    rows.scrollTop = rows.scrollHeight;
    rows.dispatchEvent(new Event('scroll'));
    for (;;) {
        await new Promise(r => requestAnimationFrame(r));
        const drawn = [...rows.querySelectorAll('[data-sandbox]')];
        const bottom = rows.scrollTop + rows.clientHeight;
        if (drawn.some(r => r.offsetTop + r.offsetHeight >= bottom - 1)) {
            return performance.now() - began;
        }
    }
}"""

BACK_TO_TOP = """() => {
    const rows = document.querySelector('[data-testid=sandbox-rows]');
    rows.scrollTop = 0;
    rows.dispatchEvent(new Event('scroll'));
}"""


def run_apart(work: Coroutine[Any, Any, T]) -> T:
    """`work` run to its end on a thread of its own: Playwright's sync API holds an event
    loop in this thread while the browser is open."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def grow(state: ClusterState, count: int) -> float:
    """`count` more sandboxes through the control plane; creates/s."""
    load = Load(state)
    try:
        rate = await populate(load, count, WORKERS) if count > 0 else 0.0
        if load.errors:
            raise SystemExit(f"creates failed: {dict(load.errors)}")
        return rate
    finally:
        await load.client.aclose()


def measure(page: Page, state: ClusterState, size: int) -> dict[str, Any]:
    page.goto(state.control.url + "/console/")
    page.get_by_label("API key").wait_for()
    paint = page.evaluate(PAINT)
    wire = page.evaluate(WIRE_BYTES)
    sign_in(page, state.control.url, state.api_key)
    count = page.get_by_test_id("sandbox-count")
    expect(count).to_have_text(f"{size} of {size}", timeout=120_000)
    expect(count).not_to_have_attribute("data-drawn-ms", "")
    drawn = float(count.get_attribute("data-drawn-ms") or "nan")
    drawn_rows = page.locator("[data-sandbox]").count()
    scroll = page.evaluate(SCROLL_TO_END)
    page.evaluate(BACK_TO_TOP)  # the newest sandbox is listed first
    began = time.perf_counter()
    made = run_apart(_create_one(state))
    expect(page.locator(f'[data-sandbox="{made}"]')).to_have_count(1, timeout=30_000)
    shown = time.perf_counter() - began
    return {
        "first_paint_ms": paint,
        "wire_kb": round(wire / 1024, 1),
        "drawn_ms": round(drawn, 1),
        "rows_in_page": drawn_rows,
        "scroll_to_end_ms": round(scroll, 1),
        "create_to_listed_s": round(shown, 2),
    }


async def _create_one(state: ClusterState) -> str:
    load = Load(state)
    try:
        await load.create(time.perf_counter())
        return load.ids[-1]
    finally:
        await load.client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="40,1000,10000", help="fleet sizes, ascending")
    parser.add_argument("--hollow", type=int, default=20)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    directory = Path(tempfile.mkdtemp(prefix="aenv-bench-console-", dir="/tmp"))
    local = LocalCluster(directory, env=ENV)
    state = local.up(0)
    try:
        local.add_hollow(args.hollow, HOLLOW_ENV)
        fleet = 0
        with chromium() as browser:
            for size in sizes:
                rate = run_apart(grow(state, size - fleet))
                context = browser.new_context()
                try:
                    figures = measure(context.new_page(), state, size)
                finally:
                    context.close()
                fleet = size + 1  # and the one created while measuring
                emit(bench="console", sandboxes=size, hollow_nodes=args.hollow,
                     populate_per_s=round(rate, 1), **figures)  # fmt: skip
    finally:
        local.down()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


if __name__ == "__main__":
    main()
