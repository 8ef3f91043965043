"""Memory density: K sandboxes of 512 MiB from one template run an agent-like burst
(allocate and free 200 MB, write and delete a 100 MB file, run Python), then idle.

Prints JSON lines: the host memory they hold (the sum of their VMMs' PSS, with and
without TCG's translation buffer, and the drop of the host's MemAvailable) against the
guest memory they were given, at peak and after idle; whether every sandbox still answers;
and the burst on an idle sandbox against the same burst on a fresh one, each alone. With
`--ksm`, also what the host kernel's same-page merging adds on top, after idle (the
host's KSM settings are put back, and merged pages unmerged, at the end).
Run: `python -m benchmarks.bench_density [--count K] [--idle SECONDS] [--ksm]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.e2e.test_sandbox_lifecycle import run
from tests.live import LiveServer, vmm_pid

from .harness import create_sandbox, kill_all, live_server

MEMORY_MB = 512
PAGE = 4096
BURST = " && ".join(
    [
        "python3 -c 'b = bytearray(200 << 20); b[::4096] = b\"x\" * (200 << 8); del b'",
        "dd if=/dev/urandom of=$HOME/burst bs=1M count=100 status=none",
        "rm $HOME/burst",
        "python3 -c 'import json, hashlib, sqlite3, email.parser; print(\"ok\")'",
    ]
)


def _meminfo_mb(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) // 1024
    raise KeyError(key)


def vmm_memory_mb(pid: int) -> tuple[float, float]:
    """(PSS of the whole VMM, PSS of its translation buffer: the anonymous RWX mapping)."""
    total = buffer = 0
    in_buffer = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            in_buffer = fields[1] == "rwxp" and fields[4] == "0" and len(fields) == 5
        elif fields[0] == "Pss:":
            total += int(fields[1])
            if in_buffer:
                buffer += int(fields[1])
    return total / 1024, buffer / 1024


def guest_ram_mb(pid: int, sandboxes_dir: Path) -> tuple[float, float]:
    """(pages of the guest's RAM the VMM holds alone, pages it shares with the snapshot's
    page cache): a private mapping's page is its own once written (`/proc/PID/pagemap`)."""
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[5].startswith(f"{sandboxes_dir}/"):
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if high - low >= MEMORY_MB << 19:  # the RAM, not a small file it maps
                break
    else:
        return 0.0, 0.0
    with open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        pagemap.seek(low // PAGE * 8)
        entries = memoryview(pagemap.read((high - low) // PAGE * 8)).cast("Q")
    present = [e for e in entries if e >> 63]
    shared = sum(1 for e in present if e >> 61 & 1)
    return (len(present) - shared) * PAGE / 2**20, shared * PAGE / 2**20


def held(server: LiveServer, sandbox_ids: list[str], baseline_available: int) -> dict:
    pids = [pid for pid in (vmm_pid(server, i) for i in sandbox_ids) if pid is not None]
    figures = [vmm_memory_mb(pid) for pid in pids]
    pss = sum(f[0] for f in figures)
    buffers = sum(f[1] for f in figures)
    ram = [guest_ram_mb(pid, server.home / "sandboxes") for pid in pids]
    guest = MEMORY_MB * len(sandbox_ids)
    drop = baseline_available - _meminfo_mb("MemAvailable")
    return {
        "vmm_pss_mb": round(pss),
        "translation_buffers_mb": round(buffers),
        "per_sandbox_mb": round(pss / len(figures), 1),
        "per_sandbox_without_buffer_mb": round((pss - buffers) / len(figures), 1),
        # Of which: guest pages written since the restore, and the snapshot's pages it
        # maps (each process's PSS counts a share of those).
        "guest_private_per_sandbox_mb": round(sum(r[0] for r in ram) / len(ram), 1),
        "guest_shared_mapped_per_sandbox_mb": round(sum(r[1] for r in ram) / len(ram), 1),
        "overcommit": round(guest / pss, 2),
        "overcommit_without_buffer": round(guest / (pss - buffers), 2),
        "memavailable_drop_mb": drop,
        "overcommit_by_memavailable": round(guest / max(drop, 1), 2),
    }


KSM = Path("/sys/kernel/mm/ksm")
# Scan fast enough for a few GiB to be merged within a minute or two.
KSM_SETTINGS = {"pages_to_scan": "20000", "sleep_millisecs": "20", "use_zero_pages": "1"}


@contextlib.contextmanager
def ksm_merging() -> Iterator[None]:
    """KSM on for the block; the host's settings back, and every page unmerged, after."""
    saved = {name: (KSM / name).read_text() for name in (*KSM_SETTINGS, "run")}
    try:
        for name, value in KSM_SETTINGS.items():
            (KSM / name).write_text(value)
        (KSM / "run").write_text("1")
        yield
    finally:
        (KSM / "run").write_text("2")
        for name, value in saved.items():
            (KSM / name).write_text(value)


def wait_full_scans(count: int, timeout: float) -> int:
    """Wait until KSM has scanned every mergeable page `count` more times."""
    start = int((KSM / "full_scans").read_text())
    deadline = time.monotonic() + timeout
    while int((KSM / "full_scans").read_text()) < start + count and time.monotonic() < deadline:
        time.sleep(1)
    return int((KSM / "full_scans").read_text()) - start


def burst(server: LiveServer, sandbox: dict) -> float:
    start = time.perf_counter()
    out, err, code = run(server, sandbox, BURST)
    assert code == 0 and out.strip() == "ok", (out, err)
    return time.perf_counter() - start


def answers(server: LiveServer, sandbox: dict) -> bool:
    try:
        return run(server, sandbox, "echo up")[0] == "up\n"
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--ksm", action="store_true", help="also measure with KSM merging")
    parser.add_argument("--translation-buffer-mb", type=int, default=64, help="TCG's, per VM")
    args = parser.parse_args()
    env = {
        "AENV_SANDBOX_MEMORY_MB": str(MEMORY_MB),
        # Mergeable, so that the KSM phase can merge; KSM itself is off until then.
        "AENV_SANDBOX_MERGE_IDENTICAL_PAGES": "true" if args.ksm else "false",
        "AENV_VMM_TCG_TRANSLATION_BUFFER_MB": str(args.translation_buffer_mb),
        # Guest memory is the point here: admission counts it at 4x host memory.
        "AENV_SANDBOX_MEMORY_OVERCOMMIT": "4",
    }
    with live_server(env) as server:
        warm = create_sandbox(server)  # the boot snapshot exists before the baseline is taken
        kill_all(server, [warm["sandboxID"]])
        time.sleep(3)
        baseline = _meminfo_mb("MemAvailable")
        # Long enough to outlive the whole run (the default 300 s does not).
        sandboxes = [create_sandbox(server, timeout=3600) for _ in range(args.count)]
        ids = [s["sandboxID"] for s in sandboxes]
        try:
            # The first burst runs alone: the one the burst after idle is held against.
            alone = burst(server, sandboxes[0])
            with ThreadPoolExecutor(2) as pool:
                fresh = list(pool.map(lambda s: burst(server, s), sandboxes[1:]))
            peak = held(server, ids, baseline)
            time.sleep(args.idle)
            idle = held(server, ids, baseline)
            with ThreadPoolExecutor(4) as pool:
                answering = sum(pool.map(lambda s: answers(server, s), sandboxes))
            common = {
                "bench": "density",
                "sandboxes": args.count,
                "memory_mb": MEMORY_MB,
                "translation_buffer_mb": args.translation_buffer_mb,
            }
            print(json.dumps({**common, "at": "peak", **peak}))
            print(json.dumps({**common, "at": f"after {args.idle:.0f} s idle", **idle}))
            if args.ksm and KSM.is_dir():
                with ksm_merging():
                    scans = wait_full_scans(3, 300)
                    merged = held(server, ids, baseline)
                    merged["ksm_full_scans"] = scans
                    merged["ksm_pages_sharing"] = int((KSM / "pages_sharing").read_text())
                    merged["ksm_zero_pages"] = int((KSM / "ksm_zero_pages").read_text())
                    print(json.dumps({**common, "at": "after idle, with KSM", **merged}))
            after_idle = burst(server, sandboxes[0])
            print(
                json.dumps(
                    {
                        **common,
                        "answering": answering,
                        "burst_fresh_alone_s": round(alone, 2),
                        "burst_fresh_two_at_a_time_p50_s": round(statistics.median(fresh), 2),
                        "burst_after_idle_s": round(after_idle, 2),
                        "after_idle_over_fresh": round(after_idle / alone, 2),
                    }
                )
            )
        finally:
            kill_all(server, ids)


if __name__ == "__main__":
    main()
