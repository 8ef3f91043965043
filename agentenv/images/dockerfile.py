"""A Dockerfile as template build steps (what `aenv build -f` sends, as the SDKs'
`Template.from_dockerfile` does).

FROM, RUN, COPY/ADD of local files, ENV, WORKDIR, USER and ARG (one with a default
becomes an ENV step for the build) become steps; CMD or ENTRYPOINT becomes the start
command. As with E2B's `Template.from_dockerfile`, steps start as root in / (Docker's
defaults) and the template ends as `user` in /home/user unless the file sets USER or
WORKDIR. Variables in ENV, WORKDIR, USER and COPY destinations are left for the builder,
which expands them in step order; FROM and COPY sources are expanded here (the client
needs them). Instructions that describe an image rather than build one (EXPOSE, LABEL,
VOLUME, ...) are skipped with a note.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from ..errors import InvalidInput
from .buildscripts import DEFAULT_USER
from .catalog import BASE, E2B_BASE_IMAGES

# Built only as metadata of an OCI image; a template has no use for them.
_SKIPPED = {"EXPOSE", "LABEL", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "ONBUILD"}
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class CopySource:
    """A COPY step's local files: `src` under the build context, placed at `dest`."""

    src: str
    dest: str
    owner: str = ""
    mode: str = ""


@dataclass
class DockerfileRecipe:
    """The build request a Dockerfile makes: its parent, steps and start command."""

    from_image: str | None = None
    from_template: str | None = None
    # Steps in the API's shape; a COPY step's `filesHash` is filled in once its files are.
    steps: list[dict[str, object]] = field(default_factory=list)
    copies: list[CopySource] = field(default_factory=list)
    start_cmd: str | None = None
    notes: list[str] = field(default_factory=list)


def parse_dockerfile(text: str) -> DockerfileRecipe:
    """The recipe of a single-stage Dockerfile; InvalidInput naming the line otherwise."""
    recipe = DockerfileRecipe()
    # What this file sets so far, for FROM and COPY sources (the builder has the rest).
    known: dict[str, str] = {}
    # ARGs declared before FROM: only FROM sees them, unless declared again after it.
    global_args: dict[str, str] = {}
    named: set[str] = set()
    for number, line in _instructions(text):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        where = f"line {number}: {keyword}"
        started = bool(recipe.from_image or recipe.from_template)
        if keyword == "ARG":
            for name, default in _args(rest, where):
                if not started:
                    if default is not None:
                        global_args[name] = default
                    continue
                default = global_args.get(name) if default is None else default
                if default is not None:
                    known[name] = _substitute(default, known)
                    recipe.steps.append({"type": "ENV", "args": [name, default]})
            continue
        if keyword == "FROM":
            if started:
                raise InvalidInput(f"{where}: multi-stage Dockerfiles are not supported")
            rest = _substitute(rest, global_args)
            image = rest.split()[0] if rest else ""
            if not image:
                raise InvalidInput(f"{where} needs an image")
            if image == BASE or image in E2B_BASE_IMAGES:
                recipe.from_template = BASE
            else:
                recipe.from_image = image
            # Docker's defaults; the builder's own would be E2B's `user`.
            recipe.steps += [
                {"type": "USER", "args": ["root"]},
                {"type": "WORKDIR", "args": ["/"]},
            ]
        elif not started:
            raise InvalidInput(f"{where} comes before FROM")
        elif keyword == "RUN":
            recipe.steps.append({"type": "RUN", "args": [_shell(rest, where)]})
        elif keyword in ("COPY", "ADD"):
            recipe.steps.extend(_copy(recipe, rest, where, known))
        elif keyword == "ENV":
            pairs = _env(rest, where)
            for name, value in zip(pairs[::2], pairs[1::2], strict=True):
                known[name] = _substitute(value, known)
            recipe.steps.append({"type": "ENV", "args": pairs})
        elif keyword in ("WORKDIR", "USER"):
            if not rest:
                raise InvalidInput(f"{where} needs an argument")
            named.add(keyword)
            recipe.steps.append({"type": keyword, "args": [rest]})
        elif keyword in ("CMD", "ENTRYPOINT"):
            recipe.start_cmd = _shell(rest, where)
        elif keyword in _SKIPPED:
            recipe.notes.append(f"{where} is skipped: templates have no use for it")
        else:
            raise InvalidInput(f"{where} is not supported")
    if not (recipe.from_image or recipe.from_template):
        raise InvalidInput("the Dockerfile has no FROM")
    # E2B's defaults for what the file never set.
    if "USER" not in named:
        recipe.steps.append({"type": "USER", "args": [DEFAULT_USER]})
    if "WORKDIR" not in named:
        recipe.steps.append({"type": "WORKDIR", "args": [f"/home/{DEFAULT_USER}"]})
    return recipe


def _args(rest: str, where: str) -> list[tuple[str, str | None]]:
    """An ARG's names and defaults (None: declared without one)."""
    found: list[tuple[str, str | None]] = []
    for word in shlex.split(rest):
        name, sep, default = word.partition("=")
        if not _NAME.fullmatch(name):
            raise InvalidInput(f"{where}: {name!r} is not a variable name")
        found.append((name, default if sep else None))
    if not found:
        raise InvalidInput(f"{where} needs a name")
    return found


def _instructions(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with comments dropped and continuations joined."""
    found: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        found.append((start, " ".join(p for p in pending if p)))
        pending = []
    if pending:
        found.append((start, " ".join(p for p in pending if p)))
    return found


def _substitute(text: str, args: dict[str, str]) -> str:
    """Known values in place of `$NAME`/`${NAME}`; others stay as written."""
    return _VARIABLE.sub(lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def _shell(rest: str, where: str) -> str:
    """A command in shell form as it is; in exec form (JSON) as a quoted command line."""
    if rest.startswith("["):
        try:
            argv = json.loads(rest)
        except ValueError:
            raise InvalidInput(f"{where}: the exec form must be a JSON array") from None
        if not argv or not all(isinstance(a, str) for a in argv):
            raise InvalidInput(f"{where}: the exec form must be a JSON array of strings")
        return shlex.join(argv)
    if not rest:
        raise InvalidInput(f"{where} needs a command")
    return rest


def _copy(
    recipe: DockerfileRecipe, rest: str, where: str, known: dict[str, str]
) -> list[dict[str, object]]:
    words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    owner = mode = ""
    while words and str(words[0]).startswith("--"):
        flag, _, value = str(words.pop(0)).partition("=")
        if flag == "--chown":
            owner = value
        elif flag == "--chmod":
            mode = value
        else:
            raise InvalidInput(f"{where}: {flag} is not supported (only --chown and --chmod)")
    if len(words) < 2:
        raise InvalidInput(f"{where} needs a source and a destination")
    *sources, dest = words
    steps: list[dict[str, object]] = []
    for src in (_substitute(str(source), known) for source in sources):
        if "://" in src:
            raise InvalidInput(f"{where}: only files of the build context can be copied")
        recipe.copies.append(CopySource(src, dest, owner, mode))
        steps.append({"type": "COPY", "args": [src, dest, owner, mode]})
    return steps


def _env(rest: str, where: str) -> list[str]:
    words = shlex.split(rest)
    if not words:
        raise InvalidInput(f"{where} needs a name and a value")
    if "=" not in words[0]:
        # The legacy form: ENV NAME value with spaces
        name, _, value = rest.partition(" ")
        return [name, value.strip()]
    pairs: list[str] = []
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise InvalidInput(f"{where}: {word!r} is not NAME=value")
        pairs += [name, value]
    return pairs
