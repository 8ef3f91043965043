"""Agent frameworks, unmodified, against a live server: smolagents' E2B executor runs a
scripted agent's code in a `code-interpreter-v1` sandbox of ours (no LLM is called)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox
from smolagents import CodeAgent
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import TokenUsage

from ..live import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.slow, pytest.mark.usefixtures("code_interpreter_env")]


class ScriptedModel(Model):
    """Answers each step with the next of its code actions, as a model would."""

    def __init__(self, actions: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.actions: Iterator[str] = iter(actions)
        self.prompts: list[list[ChatMessage]] = []

    def generate(self, messages: list[Any], **_: Any) -> ChatMessage:
        self.prompts.append(messages)
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=next(self.actions),
            token_usage=TokenUsage(input_tokens=0, output_tokens=0),
        )


def test_smolagents_code_agent_runs_in_our_sandbox(code_interpreter_server: LiveServer) -> None:
    model = ScriptedModel(
        [
            "Thought: compute in the sandbox and leave a mark there.\n<code>\n"
            "import socket\n"
            "squares = [n * n for n in range(10)]\n"
            "open('/tmp/smolagents-was-here', 'w').write(socket.gethostname())\n"
            "print('sum', sum(squares))\n</code>",
            # The second step reads the variable the first left in the kernel.
            "Thought: answer with it.\n<code>\nfinal_answer({'total': sum(squares)})\n</code>",
        ]
    )
    agent = CodeAgent(
        tools=[], model=model, executor_type="e2b", executor_kwargs={"metadata": {"by": "smol"}}
    )
    try:
        answer = agent.run("Sum the squares below ten.")
        sandbox_id = agent.python_executor.sandbox.sandbox_id
        assert answer == {"total": 285}
        # The first step's output came back to the model as its observation.
        assert any("sum 285" in str(message) for message in model.prompts[-1])
        # It ran in a sandbox of this server, from the template the SDK asks for.
        (listed,) = [s for s in Sandbox.list().next_items() if s.sandbox_id == sandbox_id]
        assert "code-interpreter-v1" in (listed.name, listed.template_id)
        assert listed.metadata == {"by": "smol"}
        sandbox = Sandbox.connect(sandbox_id)
        assert sandbox.files.read("/tmp/smolagents-was-here")
    finally:
        agent.cleanup()
    assert sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
