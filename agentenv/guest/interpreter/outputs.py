"""Jupyter iopub messages -> the NDJSON objects the SDKs parse from ``POST /execute``."""

from __future__ import annotations

import json
from typing import Any

Output = dict[str, Any]

# MIME type -> the field of the SDK's Result that carries it; the rest go to `extra`.
RESULT_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    # Filled in the python kernel by kernel_startup: a DataFrame's columns, a figure's chart.
    "e2b/data": "data",
    "e2b/chart": "chart",
}
END_OF_EXECUTION: Output = {"type": "end_of_execution"}
# Written while a cell runs quietly, so a client that went away is noticed; the SDKs skip it.
KEEPALIVE: Output = {"type": "keepalive"}


def line(output: Output) -> bytes:
    return json.dumps(output).encode() + b"\n"


def result(data: dict[str, Any], is_main_result: bool) -> Output:
    """A display_data or execute_result bundle as the SDK's Result."""
    out: Output = {"type": "result", "is_main_result": is_main_result}
    extra = {}
    for mime, value in data.items():
        field = RESULT_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif value is not None:
            out[field] = value
    text = out.get("text")
    # E2B's service shows a string result without its repr quotes ('a' -> a); so do we.
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    if not out.get("chart"):
        out.pop("chart", None)
    out["extra"] = extra
    return out


def error(name: str, value: str, traceback: str) -> Output:
    return {"type": "error", "name": name, "value": value, "traceback": traceback}


def from_iopub(msg: dict[str, Any]) -> Output | None:
    """The wire object for one iopub message of a user's cell, or None for those the SDKs
    do not see (status, execute_input's echo, comms)."""
    kind = msg["msg_type"]
    content = msg["content"]
    if kind == "stream":
        stream = "stderr" if content.get("name") == "stderr" else "stdout"
        return {"type": stream, "text": content.get("text", ""), "timestamp": _date(msg)}
    if kind == "execute_result":
        return result(content.get("data", {}), is_main_result=True)
    if kind == "display_data":
        return result(content.get("data", {}), is_main_result=False)
    if kind == "error":
        return error(
            content.get("ename", ""),
            content.get("evalue", ""),
            "\n".join(content.get("traceback", [])),
        )
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": content.get("execution_count")}
    return None


def _date(msg: dict[str, Any]) -> str:
    date = msg["header"].get("date")
    return date.isoformat() if hasattr(date, "isoformat") else str(date or "")
