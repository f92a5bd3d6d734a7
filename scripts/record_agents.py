"""Record what the real agent CLIs send, for the replay tests
(``tests/fixtures/agents/``). A developer's tool, never run by the tests.

It starts turbospark on a scripted model (so a run takes seconds, not the
minutes an 18k-token prompt takes to prefill on a laptop) that answers the
first tool-offering turn with one tool call and everything else with a short
text, puts a recording proxy in front of it, and runs ``claude -p`` and
``codex exec`` (from ``--bin``, e.g. ``.agents/node_modules/.bin``) through the
proxy with a task that needs one shell call. Every request is written as
one JSON line: method, path, query, headers (credentials dropped), body.

    python scripts/record_agents.py --bin .agents/node_modules/.bin --out /tmp/agents.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes import Script, ScriptedModel  # noqa: E402
from turbospark.server import Server  # noqa: E402

SECRET_HEADERS = {"authorization", "x-api-key", "cookie"}
TASK = "Run the shell command `echo hi` and tell me what it printed."


def _calls(tool: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": args}) + "\n</tool_call>"


class ToolThenText(ScriptedModel):
    """A call to the shell tool the client offers when the conversation has
    no tool result yet, plain text otherwise. Its "template" renders tools
    (so they reach ``render_chat``) in the Hermes syntax."""

    template = SimpleNamespace(source="{% for tool in tools %}{{ tool }}{% endfor %}<tool_call>")

    def generate(self, prompt_ids: list[int], config: Any, images: Any, cancel: Any) -> Any:
        last = self.calls[-1] if self.calls else {}
        messages = last.get("messages") or []
        tools = last.get("tools") or []
        answered = any(m.get("role") == "tool" for m in messages)
        shell = _shell_tool(tools, messages)
        if config.tool_call_check is not None and shell is not None and not answered:
            self.scripts = [Script([_calls(*shell)])]
        else:
            self.scripts = [Script(["It", " printed", " hi."])]
        return super().generate(prompt_ids, config, images, cancel)


def _shell_tool(tools: list[dict[str, Any]], messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """(name, arguments) of a call running ``echo hi`` with the offered
    shell tool (Claude Code's ``Bash``, Codex's ``shell``/``exec_command``)."""
    for tool in tools:
        fn = tool.get("function", tool)
        name = fn.get("name", "")
        props = (fn.get("parameters") or {}).get("properties") or {}
        if name in ("Bash", "shell", "exec_command", "local_shell"):
            if "cmd" in props:
                return name, {"cmd": "echo hi"}
            if (props.get("command") or {}).get("type") == "array":
                return name, {"command": ["bash", "-lc", "echo hi"]}
            return name, {"command": "echo hi", "description": "Print hi"}
    return None


#: long texts (system prompts, tool descriptions) are cut to this many
#: characters, so a recording fits a small test model's context; every field
#: and the structure stay
TRIM = 300


def trim(value: Any) -> Any:
    if isinstance(value, str) and len(value) > TRIM:
        return value[:TRIM] + " [trimmed]"
    if isinstance(value, list):
        return [trim(v) for v in value]
    if isinstance(value, dict):
        return {k: trim(v) for k, v in value.items()}
    return value


def recording_proxy(upstream: str, out: Path) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=None)
    lock = threading.Lock()

    async def forward(request: Request) -> Response:
        body = await request.body()
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        record = {
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": {k: v for k, v in request.headers.items() if k.lower() not in SECRET_HEADERS},
            "body": trim(parsed),
        }
        with lock, out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        req = client.build_request(
            request.method, request.url.path, params=request.url.query, headers=headers, content=body
        )
        resp = await client.send(req, stream=True)
        drop = ("content-length", "transfer-encoding", "content-encoding", "connection")
        return StreamingResponse(
            resp.aiter_raw(),
            status_code=resp.status_code,
            headers={k: v for k, v in resp.headers.items() if k.lower() not in drop},
            background=None,
        )

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "HEAD", "DELETE", "PUT"])])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="folder holding the claude and codex executables")
    ap.add_argument("--out", required=True, help="JSON-lines file to append the requests to")
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--only", choices=["claude", "codex"], default=None)
    args = ap.parse_args()
    out = Path(args.out)
    model = ToolThenText(model_id="qwen2.5-coder-0.5b", context=200_000)
    with Server(models=[model]) as srv:
        proxy = uvicorn.Server(uvicorn.Config(recording_proxy(srv.url, out), port=args.port, log_level="warning"))
        thread = threading.Thread(target=lambda: asyncio.run(proxy.serve()), daemon=True)
        thread.start()
        while not proxy.started:
            threading.Event().wait(0.05)
        url = f"http://127.0.0.1:{args.port}"
        home = tempfile.mkdtemp(prefix="agents-home-")
        env = {
            **os.environ,
            "HOME": home,
            "ANTHROPIC_BASE_URL": url,
            "ANTHROPIC_API_KEY": "sk-local",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "TURBOSPARK_KEY": "sk-local",
        }
        work = tempfile.mkdtemp(prefix="agents-work-")
        runs = []
        if args.only in (None, "claude"):
            runs.append(
                [
                    str(Path(args.bin) / "claude"),
                    "-p",
                    TASK,
                    "--allowedTools",
                    "Bash",
                    "--model",
                    "qwen2.5-coder-0.5b",
                ]
            )
        if args.only in (None, "codex"):
            codex_home = Path(home) / ".codex"
            codex_home.mkdir()
            (codex_home / "config.toml").write_text(
                'model = "qwen2.5-coder-0.5b"\nmodel_provider = "turbospark"\n\n'
                "[model_providers.turbospark]\n"
                'name = "turbospark"\n'
                f'base_url = "{url}/v1"\n'
                'wire_api = "responses"\n'
                'env_key = "TURBOSPARK_KEY"\n'
            )
            runs.append(
                [
                    str(Path(args.bin) / "codex"),
                    "exec",
                    "--skip-git-repo-check",
                    "--dangerously-bypass-approvals-and-sandbox",
                    TASK,
                ]
            )
        for cmd in runs:
            print("$", " ".join(cmd[:2]), flush=True)
            done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=300)
            print("exit", done.returncode)
            print(done.stdout[-2000:])
            print(done.stderr[-2000:], file=sys.stderr)
        proxy.should_exit = True
        thread.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
