"""The code interpreter's execution service on real Jupyter kernels, driven by the official
SDK (``e2b-code-interpreter``) as a user's code drives it; no VM."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, OutputMessage, Sandbox

from tests.guest.interp_service import (
    DENO,
    SANDBOX_ENVS,
    TOKEN,
    FakeAgent,
    Service,
    children,
    fake_agent,
    running_service,
)


@pytest.fixture(scope="module")
def agent() -> Iterator[FakeAgent]:
    with fake_agent() as agent:
        yield agent


@pytest.fixture(scope="module")
def service(agent: FakeAgent, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with running_service(tmp_path_factory.mktemp("interp"), agent) as service:
        yield service


@pytest.fixture
def sbx(service: Service) -> Sandbox:
    return service.sandbox()


def test_run_code_returns_the_cells_value(sbx: Sandbox) -> None:
    execution = sbx.run_code("1 + 1")
    assert execution.text == "2"
    assert execution.error is None
    assert execution.results[0].is_main_result


def test_output_streams_to_the_callbacks(sbx: Sandbox) -> None:
    stdout, stderr, results = [], [], []
    execution = sbx.run_code(
        "import sys\nprint('out')\nprint('err', file=sys.stderr)\n'done'",
        on_stdout=stdout.append,
        on_stderr=stderr.append,
        on_result=results.append,
    )
    assert [m.line for m in stdout] == ["out\n"]
    assert [m.line for m in stderr] == ["err\n"]
    assert [r.text for r in results] == ["done"]
    assert execution.logs.stdout == ["out\n"] and execution.logs.stderr == ["err\n"]


def test_state_is_kept_across_calls(sbx: Sandbox) -> None:
    first = sbx.run_code("counter = 41")
    second = sbx.run_code("counter + 1")
    assert second.text == "42"
    assert first.execution_count is not None and second.execution_count == first.execution_count + 1


def test_an_exception_comes_back_with_its_traceback(sbx: Sandbox) -> None:
    errors = []
    execution = sbx.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "return 1 / 0" in execution.error.traceback
    assert "\x1b[" not in execution.error.traceback  # plain, not coloured
    assert errors == [execution.error]
    assert sbx.run_code("'still alive'").text == "still alive"


def test_a_matplotlib_figure_comes_back_as_png_and_chart(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 5, 6], label='up')\n"
        "plt.title('Growth')\n"
        "plt.xlabel('time (s)')\n"
        "plt.show()"
    )
    assert execution.error is None, execution.error
    [figure] = execution.results
    assert figure.png and figure.png.startswith("iVBOR")  # base64 of a PNG header
    chart = figure.chart
    assert chart is not None and chart.type == "line"
    assert chart.title == "Growth"
    assert chart.x_label == "time (s)" and chart.x_unit == "s"
    assert chart.elements[0].label == "up"
    assert chart.elements[0].points == [(1.0, 4.0), (2.0, 5.0), (3.0, 6.0)]


def test_a_dataframe_comes_back_as_html_and_data(sbx: Sandbox) -> None:
    execution = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert execution.error is None, execution.error
    [table] = execution.results
    assert table.html and "<table" in table.html
    assert table.data == {"a": [1, 2], "b": ["x", "y"]}


def test_rich_display_types_reach_their_fields(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "from IPython.display import display, HTML, Markdown, Latex, JSON, SVG\n"
        "display(HTML('<b>h</b>'), Markdown('# m'), Latex(r'$x$'), JSON({'k': 1}))\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"/>'))"
    )
    assert execution.error is None, execution.error
    html, markdown, latex, json_, svg = execution.results
    assert html.html == "<b>h</b>" and markdown.markdown == "# m" and latex.latex == "$x$"
    assert json_.json == {"k": 1}
    assert svg.svg and "<svg" in svg.svg
    assert not any(r.is_main_result for r in execution.results)


def test_contexts_are_created_listed_restarted_and_removed(sbx: Sandbox, service: Service) -> None:
    workdir = service.cwd / "project"
    workdir.mkdir()
    context = sbx.create_code_context(cwd=str(workdir))
    assert context.language == "python" and context.cwd == str(workdir)
    assert context.id in {c.id for c in sbx.list_code_contexts()}
    assert sbx.run_code("import os; os.getcwd()", context=context).text == str(workdir)
    sbx.run_code("kept = 1", context=context)
    assert sbx.run_code("kept", context=context).text == "1"
    # The default context does not see it.
    assert sbx.run_code("kept").error is not None

    sbx.restart_code_context(context)
    assert sbx.run_code("kept", context=context).error.name == "NameError"

    sbx.remove_code_context(context)
    assert context.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=context)


def test_context_and_language_together_are_refused(service: Service) -> None:
    body = {"code": "1", "context_id": "x", "language": "python"}
    assert httpx.post(f"{service.url}/execute", json=body).status_code == 400
    with pytest.raises(SandboxException):
        service.sandbox().run_code("1", language="cobol")


def test_the_sandboxs_env_vars_come_from_the_agent_with_the_token(
    sbx: Sandbox, agent: FakeAgent
) -> None:
    context = sbx.create_code_context()
    execution = sbx.run_code("import os; os.environ['SANDBOX_VAR']", context=context)
    assert execution.text == SANDBOX_ENVS["SANDBOX_VAR"]
    assert agent.tokens and set(agent.tokens) == {TOKEN}


def test_request_env_vars_apply_to_that_execution_only(sbx: Sandbox) -> None:
    context = sbx.create_code_context()
    code = "import os; os.environ['SHARED'] + '/' + os.environ.get('ONLY_HERE', '-')"
    assert sbx.run_code(code, context=context).text == "sandbox/-"
    assert sbx.run_code(code, context=context, envs={"SHARED": "req", "ONLY_HERE": "1"}).text == (
        "req/1"
    )
    assert sbx.run_code(code, context=context).text == "sandbox/-"


def test_a_timeout_interrupts_the_cell_and_the_context_goes_on(sbx: Sandbox) -> None:
    context = sbx.create_code_context()
    sbx.run_code("before = 'kept'", context=context)
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\nwhile True: time.sleep(0.1)", context=context, timeout=2)
    # Had the kernel not been interrupted, this would wait behind the endless loop.
    after = sbx.run_code("before", context=context, timeout=20)
    assert after.text == "kept"


def test_two_contexts_run_at_the_same_time(sbx: Sandbox, tmp_path: Path) -> None:
    """Each cell waits for a file the other writes: both finish only if they overlap."""
    a, b = sbx.create_code_context(), sbx.create_code_context()
    code = (
        "import os, time\nopen({mine!r}, 'w').close()\n"
        "while not os.path.exists({theirs!r}): time.sleep(0.05)\n'met'"
    )
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    results: dict[str, str | None] = {}

    def run(name: str, context: object, mine: str, theirs: str) -> None:
        cell = code.format(mine=mine, theirs=theirs)
        results[name] = sbx.run_code(cell, context=context, timeout=30).text  # type: ignore[arg-type]

    threads = [
        threading.Thread(target=run, args=("a", a, first, second)),
        threading.Thread(target=run, args=("b", b, second, first)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {"a": "met", "b": "met"}


def test_bash_runs_with_state_and_env_vars(sbx: Sandbox) -> None:
    execution = sbx.run_code("echo hello; WORD=kept", language="bash")
    assert execution.error is None, execution.error
    assert "".join(execution.logs.stdout) == "hello\n"
    execution = sbx.run_code('echo "$WORD $GREETING"', language="bash", envs={"GREETING": "hi"})
    assert "".join(execution.logs.stdout) == "kept hi\n"
    contexts = sbx.list_code_contexts()
    assert "bash" in {c.language for c in contexts}


def test_the_supervisor_restarts_a_killed_server(agent: FakeAgent, tmp_path: Path) -> None:
    with running_service(tmp_path, agent) as service:
        server = service.server_pid()
        kernels = children(server)
        assert kernels, "the default python kernel runs under the server"
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while service.server_pid_or_none() in (None, server):
            assert time.monotonic() < deadline, "no new server"
            time.sleep(0.05)
        service.wait_healthy()
        assert service.sandbox().run_code("6 * 7").text == "42"
        # The dead server's kernels were killed, not left behind.
        assert all(not Path(f"/proc/{pid}").exists() for pid in kernels)


def test_a_client_leaving_while_queued_does_not_interrupt_the_running_cell(
    sbx: Sandbox, tmp_path: Path
) -> None:
    context = sbx.create_code_context()
    started, release = tmp_path / "started", tmp_path / "release"
    first: dict[str, Any] = {}

    def run_first() -> None:
        cell = (
            f"import os, time\nopen({str(started)!r}, 'w').close()\n"
            f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n'first'"
        )
        first["execution"] = sbx.run_code(cell, context=context, timeout=60)

    thread = threading.Thread(target=run_first)
    thread.start()
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(TimeoutException):
        sbx.run_code("'second'", context=context, timeout=1)
    release.touch()
    thread.join(60)
    assert first["execution"].error is None
    assert first["execution"].text == "first"


def test_a_kernel_that_dies_is_reported_and_restarted(sbx: Sandbox) -> None:
    context = sbx.create_code_context()
    execution = sbx.run_code("import os; os._exit(1)", context=context, timeout=60)
    assert execution.error is not None and execution.error.name == "KernelDied"
    assert sbx.run_code("1 + 1", context=context, timeout=60).text == "2"


def test_browsers_may_call_it(service: Service) -> None:
    preflight = httpx.options(f"{service.url}/execute")
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == "*"
    assert httpx.get(f"{service.url}/contexts").headers["Access-Control-Allow-Origin"] == "*"


@pytest.mark.skipif(DENO is None, reason="no deno on this host (AENV_TEST_DENO names one)")
def test_javascript_and_typescript_run_on_deno(sbx: Sandbox) -> None:
    """Deno publishes a cell's output after its idle, and dies of SIGINT: both handled."""
    execution = sbx.run_code("console.log('hi'); const x = 40; x + 2", language="js")
    assert (execution.logs.stdout, execution.text) == (["hi\n"], "42")
    assert sbx.run_code("Deno.env.get('G') + x", language="js", envs={"G": "g"}).text == "g40"
    assert sbx.run_code("Deno.env.get('SANDBOX_VAR')", language="js").text == "from-agent"
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", language="js", timeout=2)
    assert sbx.run_code("x * 10", language="js", timeout=20).text == "400"
    error = sbx.run_code("const y: number = 1; throw new Error('boom' + y)", language="ts").error
    assert error is not None and (error.name, error.value) == ("Error", "boom1")


async def test_the_async_sdk_streams_too(service: Service) -> None:
    sync = service.sandbox()
    sbx = AsyncSandbox(
        sandbox_id=sync.sandbox_id,
        sandbox_domain=None,
        envd_version=sync._envd_version,
        envd_access_token=TOKEN,
        traffic_access_token=None,
        connection_config=sync.connection_config,
    )
    lines: list[str] = []

    async def on_stdout(message: OutputMessage) -> None:
        lines.append(message.line)

    execution = await sbx.run_code("print('async'); 'value'", on_stdout=on_stdout)
    assert (lines, execution.text) == (["async\n"], "value")
    context = await sbx.create_code_context()
    assert context.id in {c.id for c in await sbx.list_code_contexts()}
    await sbx.remove_code_context(context)
