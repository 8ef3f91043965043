"""`code-interpreter-v1` through the unmodified `e2b_code_interpreter` SDK against a live
server that built the template itself: results, streaming, state, charts, the other
languages, contexts, env vars, timeouts, concurrency, pause/resume and fork."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from e2b.exceptions import TimeoutException
from e2b_code_interpreter import Sandbox

from ..live import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.usefixtures("code_interpreter_env")]


@pytest.fixture(scope="module")
def sbx(code_interpreter_server: LiveServer) -> Iterator[Sandbox]:
    """One sandbox for the tests that only run code (each in its own variables)."""
    sandbox = Sandbox.create(
        api_key=code_interpreter_server.api_key,
        api_url=code_interpreter_server.url,
        sandbox_url=code_interpreter_server.url,
        envs={"FROM_SANDBOX": "sandbox-wide"},
    )
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_run_code_answers_as_e2bs_does(sbx: Sandbox) -> None:
    execution = sbx.run_code("1+1")
    assert execution.text == "2"
    assert execution.error is None
    assert execution.execution_count is not None and execution.execution_count >= 1


def test_output_streams_to_the_callbacks(sbx: Sandbox) -> None:
    stdout: list[str] = []
    stderr: list[str] = []
    results: list[str | None] = []
    code = "import sys\nprint('out line')\nprint('err line', file=sys.stderr)\n6 * 7"
    execution = sbx.run_code(
        code,
        on_stdout=lambda m: stdout.append(m.line),
        on_stderr=lambda m: stderr.append(m.line),
        on_result=lambda r: results.append(r.text),
    )
    assert "".join(stdout) == "out line\n"
    assert "".join(stderr) == "err line\n"
    assert results == ["42"]
    assert execution.logs.stdout == ["out line\n"]


def test_state_is_kept_across_calls_and_errors_are_reported(sbx: Sandbox) -> None:
    sbx.run_code("kept = 41")
    assert sbx.run_code("kept + 1").text == "42"
    failed = sbx.run_code("1 / 0")
    assert failed.error is not None
    assert failed.error.name == "ZeroDivisionError"
    assert "division by zero" in failed.error.value
    assert failed.error.traceback


def test_a_matplotlib_chart_comes_back_as_png_and_chart_data(sbx: Sandbox) -> None:
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6], label='line')\n"
        "plt.title('a chart')\n"
        "plt.show()"
    )
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    [result] = execution.results
    assert result.png and result.png.startswith("iVBOR")  # base64 of PNG's magic
    if result.chart is not None:
        assert result.chart.title == "a chart"


def test_javascript_r_and_bash(sbx: Sandbox) -> None:
    js = sbx.run_code("const a = 20; const b: number = 22; a + b", language="js")
    assert js.error is None, js.error
    assert js.text == "42"
    r = sbx.run_code("x <- c(1, 2, 3)\nsum(x)", language="r")
    assert r.error is None, r.error
    # IRkernel shows a value as display data, not as the cell's result.
    assert [result.text for result in r.results] == ["[1] 6"]
    bash = sbx.run_code("echo from-bash; echo $((40 + 2))", language="bash")
    assert bash.logs.stdout and "".join(bash.logs.stdout) == "from-bash\n42\n"


def test_java() -> None:
    """In a sandbox of its own: the JVM it leaves running would slow the shared one's
    next kernels past the SDK's request timeout under TCG."""
    sandbox = Sandbox.create()
    try:
        code = 'System.out.println("from java " + (40 + 2));'
        execution = sandbox.run_code(code, language="java")
        assert execution.error is None, execution.error
        assert "".join(execution.logs.stdout) == "from java 42\n"
    finally:
        sandbox.kill()


def test_contexts_have_their_own_state_and_directory(sbx: Sandbox) -> None:
    context = sbx.create_code_context(cwd="/tmp")
    try:
        assert context.cwd == "/tmp"
        sbx.run_code("mine = 'context'", context=context)
        # A string's quotes go, as in E2B's service.
        assert sbx.run_code("import os; os.getcwd()", context=context).text == "/tmp"
        assert sbx.run_code("mine", context=context).text == "context"
        assert sbx.run_code("'mine' in globals()").text == "False"
        assert context.id in {c.id for c in sbx.list_code_contexts()}
        sbx.restart_code_context(context)
        assert sbx.run_code("'mine' in globals()", context=context).text == "False"
    finally:
        sbx.remove_code_context(context)
    assert context.id not in {c.id for c in sbx.list_code_contexts()}


def test_env_vars_per_call_over_the_sandboxs(sbx: Sandbox) -> None:
    code = "import os; (os.environ.get('FROM_SANDBOX'), os.environ.get('PER_CALL'))"
    assert sbx.run_code(code).text == "('sandbox-wide', None)"
    assert sbx.run_code(code, envs={"PER_CALL": "given"}).text == "('sandbox-wide', 'given')"
    bash = sbx.run_code("echo $PER_CALL", language="bash", envs={"PER_CALL": "in-bash"})
    assert "".join(bash.logs.stdout) == "in-bash\n"


def test_a_timeout_stops_the_call_and_the_context_runs_on(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\nwhile True: time.sleep(0.1)", timeout=3)
    assert sbx.run_code("'still here'").text == "still here"


def test_two_contexts_run_at_once(sbx: Sandbox) -> None:
    """The first waits for a file only the second writes: it ends only if both run."""
    first, second = sbx.create_code_context(), sbx.create_code_context()
    waited: list[str | None] = []
    wait = (
        "import os, time\n"
        "deadline = time.time() + 60\n"
        "while not os.path.exists('/tmp/ci-flag') and time.time() < deadline:\n"
        "    time.sleep(0.1)\n"
        "os.path.exists('/tmp/ci-flag')"
    )
    thread = threading.Thread(target=lambda: waited.append(sbx.run_code(wait, context=first).text))
    try:
        thread.start()
        sbx.run_code("open('/tmp/ci-flag', 'w').close()", context=second)
        thread.join(90)
        assert waited == ["True"]
    finally:
        thread.join(90)
        sbx.remove_code_context(first)
        sbx.remove_code_context(second)


def test_a_pause_and_resume_keep_the_kernels_state(code_interpreter_server: LiveServer) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.run_code("before_pause = [1, 2, 3]")
        sandbox.pause()
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert resumed.run_code("sum(before_pause)").text == "6"
    finally:
        sandbox.kill()


def test_each_fork_keeps_the_kernels_state(code_interpreter_server: LiveServer) -> None:
    parent = Sandbox.create()
    children: list[str] = []
    try:
        parent.run_code("forked = 'from the parent'")
        results = parent.fork(count=2, timeout=120)
        children = [r.sandbox_id for r in results if not isinstance(r, Exception)]
        assert len(children) == 2, results
        for child_id in children:
            child = Sandbox.connect(child_id)
            assert child.run_code("forked").text == "from the parent"
            child.run_code("forked = 'changed in ' + str(id(forked))")
        assert parent.run_code("forked").text == "from the parent"
    finally:
        for sandbox_id in (parent.sandbox_id, *children):
            Sandbox.kill(sandbox_id)
