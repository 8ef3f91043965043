from __future__ import annotations

from agentenv.runtime.machine.cleanup import CleanupStack


async def test_runs_in_reverse_once_and_collects_errors() -> None:
    order: list[str] = []

    async def undo(name: str, fail: bool = False) -> None:
        order.append(name)
        if fail:
            raise RuntimeError(name)

    stack = CleanupStack("test")
    stack.push("a", lambda: undo("a"))
    stack.push("b", lambda: undo("b", fail=True))
    stack.push("c", lambda: undo("c"))
    errors = await stack.run()
    assert order == ["c", "b", "a"]
    assert [str(e) for e in errors] == ["b"]
    assert await stack.run() == []
    assert order == ["c", "b", "a"]


async def test_dismiss_keeps_resources() -> None:
    ran: list[str] = []

    async def undo() -> None:
        ran.append("x")

    stack = CleanupStack("test")
    stack.push("x", undo)
    stack.dismiss()
    await stack.run()
    assert ran == []
