"""Dockerfiles as template build steps."""

from __future__ import annotations

import pytest

from agentenv.errors import InvalidInput
from agentenv.images.dockerfile import CopySource, parse_dockerfile

DOCKERFILE = """
# a comment
ARG VERSION=3.11
FROM python:${VERSION}-slim
ENV APP_HOME=/srv/app MODE="two words"
ENV LEGACY some value
WORKDIR $APP_HOME
COPY --chown=user:user --chmod=0755 requirements.txt app/ ./
RUN pip install -r requirements.txt \\
    && echo done
USER user
EXPOSE 8000
CMD ["python", "-m", "http.server", "8000"]
"""


def test_a_dockerfile_becomes_steps_and_a_start_command() -> None:
    recipe = parse_dockerfile(DOCKERFILE)
    assert recipe.from_image == "python:3.11-slim" and recipe.from_template is None
    # Docker's defaults first; variables left for the builder, which expands in order.
    assert recipe.steps == [
        {"type": "USER", "args": ["root"]},
        {"type": "WORKDIR", "args": ["/"]},
        {"type": "ENV", "args": ["APP_HOME", "/srv/app", "MODE", "two words"]},
        {"type": "ENV", "args": ["LEGACY", "some value"]},
        {"type": "WORKDIR", "args": ["$APP_HOME"]},
        {"type": "COPY", "args": ["requirements.txt", "./", "user:user", "0755"]},
        {"type": "COPY", "args": ["app/", "./", "user:user", "0755"]},
        {"type": "RUN", "args": ["pip install -r requirements.txt && echo done"]},
        {"type": "USER", "args": ["user"]},
    ]
    assert recipe.copies[1] == CopySource("app/", "./", "user:user", "0755")
    assert recipe.start_cmd == "python -m http.server 8000"
    assert recipe.notes == ["line 12: EXPOSE is skipped: templates have no use for it"]


def test_args_become_env_and_the_template_ends_as_e2bs_user() -> None:
    """An ARG with a default is ENV for the build (one declared before FROM only when
    declared again); a file without USER or WORKDIR ends as `user` in its home."""
    recipe = parse_dockerfile(
        "ARG TAG=12\nARG JAVA_VERSION=11\nFROM debian:${TAG}\nARG JAVA_VERSION\n"
        "ARG NONE\nARG DIR=files\nENV JAVA_HOME=/jvm/jdk-${JAVA_VERSION}\n"
        "COPY ${DIR}/a $JAVA_HOME/\nRUN useradd -m user\n"
    )
    assert recipe.from_image == "debian:12"
    assert recipe.steps == [
        {"type": "USER", "args": ["root"]},
        {"type": "WORKDIR", "args": ["/"]},
        {"type": "ENV", "args": ["JAVA_VERSION", "11"]},
        {"type": "ENV", "args": ["DIR", "files"]},
        {"type": "ENV", "args": ["JAVA_HOME", "/jvm/jdk-${JAVA_VERSION}"]},
        {"type": "COPY", "args": ["files/a", "$JAVA_HOME/", "", ""]},
        {"type": "RUN", "args": ["useradd -m user"]},
        {"type": "USER", "args": ["user"]},
        {"type": "WORKDIR", "args": ["/home/user"]},
    ]
    assert recipe.copies == [CopySource("files/a", "$JAVA_HOME/")]


def test_e2b_base_is_the_base_template() -> None:
    assert parse_dockerfile("FROM e2bdev/base\nRUN true").from_template == "base"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RUN true", "line 1: RUN comes before FROM"),
        ("FROM a\nFROM b", "line 2: FROM: multi-stage"),
        ("FROM a\nRUN", "line 2: RUN needs a command"),
        ("FROM a\nCOPY one", "line 2: COPY needs a source and a destination"),
        ("FROM a\nADD https://x/y /y", "only files of the build context"),
        ("FROM a\nCOPY --from=builder /a /b", "--from is not supported"),
        ("FROM a\nCMD [1]", "exec form must be a JSON array of strings"),
        ("FROM a\nMAINTAINER me", "line 2: MAINTAINER is not supported"),
        ("# nothing", "no FROM"),
    ],
)
def test_what_cannot_be_built_is_refused_by_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_dockerfile(text)
