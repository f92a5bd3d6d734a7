"""The real agent CLIs (Claude Code, Codex) against turbospark. A developer's
tool, never run by the tests or CI.

``record``: turbospark on a scripted model (a run takes seconds, not the
minutes an 18k-token prompt takes to prefill on a laptop) that answers the
first tool-offering turn with one shell call and everything else with a short
text, behind a recording proxy; ``claude -p`` and ``codex exec`` run a task
that needs one shell call through it. Every request is written as one JSON
line (method, path, query, headers without credentials, body with long texts
trimmed): the source of ``tests/fixtures/agents/``.

``e2e`` (``make e2e-agents``): the same two runs against the real Qwen2.5-Coder
model with a 32k context, printing each CLI's exit code and answer and every
route and status it hit (from the server's events); then both again with a
context smaller than their first prompt, printing what each CLI makes of the
error (it must recognise it as the context's, not as a failure to retry).

    python scripts/agents.py record --bin .agents/node_modules/.bin --out /tmp/agents.jsonl
    python scripts/agents.py e2e --bin .agents/node_modules/.bin
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
import time
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
#: a context below both CLIs' first prompt (Claude Code's is about 18k
#: tokens, Codex's about 6k)
OVERFLOW_CTX = 4096


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
#: and the structure stay (call arguments, JSON text, are kept whole)
TRIM = 60


def trim(value: Any) -> Any:
    if isinstance(value, str) and len(value) > TRIM:
        return value[:TRIM] + " [trimmed]"
    if isinstance(value, list):
        return [trim(v) for v in value]
    if isinstance(value, dict):
        return {k: v if k == "arguments" else trim(v) for k, v in value.items()}
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


class Routes:
    """An observer keeping each request's method, path and final status."""

    def __init__(self, live: bool = False) -> None:
        self.live = live
        self.started: dict[int, str] = {}
        self.runs: dict[int, list[str]] = {}
        self.lines: list[str] = []

    def record(self, event: Any) -> None:
        if event.kind == "requestStarted":
            self.started[event.id] = f"{event.method} {event.path}"
        elif event.kind == "generated":  # each engine run: how it ended (a re-ask is a second run)
            run = f"{event.stop_reason} after {event.new_tokens} tokens ({event.prompt_tokens} in)"
            self.runs.setdefault(event.id, []).append(run)
            if self.live:
                print(f"  [{time.strftime('%H:%M:%S')}] #{event.id} run: {run}", file=sys.stderr, flush=True)
        elif event.kind == "requestFinished":
            runs = self.runs.pop(event.id, [])
            line = (
                f"{self.started.get(event.id, '?')} -> {event.status}"
                + (f" ({event.error})" if event.error else "")
                + (f": {'; '.join(runs)}" if runs else "")
            )
            self.lines.append(line)
            if self.live:  # (a run cut short still shows how far it got)
                print(f"  [{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def client_env(url: str, home: str, timeout_s: int) -> dict[str, str]:
    """Both CLIs pointed at ``url``, in a throw-away home; Claude Code's
    attribution header off, its API timeout raised for a slow prefill."""
    codex_home = Path(home) / ".codex"
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "qwen2.5-coder-0.5b"\nmodel_provider = "turbospark"\nmodel_context_window = 32768\n\n'
        "[model_providers.turbospark]\n"
        'name = "turbospark"\n'
        f'base_url = "{url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "TURBOSPARK_KEY"\n'
        f"stream_idle_timeout_ms = {timeout_s * 1000}\n"
    )
    return {
        **os.environ,
        "HOME": home,
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-local",
        "API_TIMEOUT_MS": str(timeout_s * 1000),
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "TURBOSPARK_KEY": "sk-local",
    }


def run_clients(bin_dir: str, url: str, only: str | None, timeout_s: int) -> None:
    bin_dir = str(Path(bin_dir).resolve())  # the clients run in a work directory of their own
    home = tempfile.mkdtemp(prefix="agents-home-")
    env = client_env(url, home, timeout_s)
    work = tempfile.mkdtemp(prefix="agents-work-")
    runs = []
    if only in (None, "claude"):
        claude = [str(Path(bin_dir) / "claude"), "-p", TASK, "--allowedTools", "Bash", "--model", "qwen2.5-coder-0.5b",
                  "--output-format", "stream-json", "--verbose"]  # fmt: skip
        runs.append(claude)
    if only in (None, "codex"):
        codex = [str(Path(bin_dir) / "codex"), "exec", "--skip-git-repo-check"]
        runs.append([*codex, "--dangerously-bypass-approvals-and-sandbox", TASK])
    for cmd in runs:
        print("$", Path(cmd[0]).name, " ".join(cmd[1:2]), flush=True)
        try:
            done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout_s * 3)
        except subprocess.TimeoutExpired:
            print(f"timed out after {timeout_s * 3} s", flush=True)
            continue
        print("exit", done.returncode)
        print(summarize_claude(done.stdout) if "stream-json" in cmd else done.stdout[-2000:], flush=True)
        print(done.stderr[-1500:], file=sys.stderr, flush=True)


def summarize_claude(stdout: str) -> str:
    """Claude Code's stream-json transcript in short: each tool call the
    model made (name, input) and what the CLI answered, then the result."""
    lines = []
    for raw in stdout.splitlines():
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        content = (msg.get("message") or {}).get("content") if isinstance(msg, dict) else None
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use":
                lines.append(f"  tool_use {block.get('name')} {json.dumps(block.get('input'))[:160]}")
            elif block.get("type") == "tool_result":
                text = block.get("content")
                text = text if isinstance(text, str) else json.dumps(text)
                lines.append(f"    -> {'error: ' if block.get('is_error') else ''}{text[:160]!r}")
        if isinstance(msg, dict) and msg.get("type") == "result":
            lines.append(f"  result: {str(msg.get('result'))[:600]}")
    return "\n".join(lines) if lines else stdout[-2000:]


def record(args: argparse.Namespace) -> None:
    model = ToolThenText(model_id="qwen2.5-coder-0.5b", context=200_000)
    with Server(models=[model]) as srv:
        proxy = uvicorn.Server(
            uvicorn.Config(recording_proxy(srv.url, Path(args.out)), port=args.port, log_level="warning")
        )
        thread = threading.Thread(target=lambda: asyncio.run(proxy.serve()), daemon=True)
        thread.start()
        while not proxy.started:
            threading.Event().wait(0.05)
        run_clients(args.bin, f"http://127.0.0.1:{args.port}", args.only, 300)
        proxy.should_exit = True
        thread.join(10)


def e2e(args: argparse.Namespace) -> None:
    from turbospark.engine.model import ModelOptions
    from turbospark.models.catalog import resolve_model

    path, _ = resolve_model("qwen2.5-coder-0.5b")
    routes = Routes(live=True)
    options = ModelOptions(path=path, id="qwen2.5-coder-0.5b", ctx=args.ctx, parallel=1)
    with Server(models=[options], observer=routes) as srv:
        run_clients(args.bin, srv.url, args.only, args.timeout)
    print("routes and statuses the CLIs hit:")
    for line in routes.lines:
        print("  ", line)
    # context truth: a context smaller than each CLI's first prompt; the
    # error is one the CLI recognises (its own words about the context)
    print(f"\nover the context (--ctx {OVERFLOW_CTX}): what each CLI makes of the error", flush=True)
    routes = Routes(live=True)
    small = ModelOptions(path=path, id="qwen2.5-coder-0.5b", ctx=OVERFLOW_CTX, parallel=1)
    with Server(models=[small], observer=routes) as srv:
        run_clients(args.bin, srv.url, args.only, args.timeout)
    print("routes and statuses the CLIs hit over the context:")
    for line in routes.lines:
        print("  ", line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("record", "e2e"):
        p = sub.add_parser(name)
        p.add_argument("--bin", required=True, help="folder holding the claude and codex executables")
        p.add_argument("--only", choices=["claude", "codex"], default=None)
    sub.choices["record"].add_argument("--out", required=True, help="JSON-lines file to append the requests to")
    sub.choices["record"].add_argument("--port", type=int, default=18765)
    sub.choices["e2e"].add_argument("--ctx", type=int, default=32768)
    sub.choices["e2e"].add_argument("--timeout", type=int, default=1800, help="seconds a CLI may wait for one reply")
    args = ap.parse_args()
    record(args) if args.command == "record" else e2e(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
