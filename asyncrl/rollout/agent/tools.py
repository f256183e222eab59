"""Tools a multi-turn rollout can call: the interface, ``calc`` and ``python``, and the runner that bounds every call.

A tool's ``call`` is a coroutine awaited on the agent's event loop beside every other row's calls: it awaits what it
waits for (``asyncio.to_thread`` for blocking work) and never blocks the loop. ``call_each`` runs one turn's calls
concurrently, each under a deadline; a tool that raises, times out, is unknown or gets bad arguments returns an error
message into the conversation and never ends the rollout. The tools and their limits: docs/agent_loop.md, "Limits".
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import operator
import sys
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal, DivisionByZero, InvalidOperation, localcontext
from typing import Any


class ToolError(Exception):
    """A tool's own failure with a message meant for the model (bad arguments, a math error, ...)."""


class Tool(ABC):
    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {}  # JSON schema of the arguments object

    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema a chat template renders (``tools=[...]``)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @abstractmethod
    async def call(self, arguments: dict[str, Any]) -> str:
        """The tool's output as text for the conversation; raise ``ToolError`` with a message for the model."""


# ---- calc ---------------------------------------------------------------------------------------------------------
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 1000
MAX_DIGITS = 4000


def evaluate_arithmetic(expression: str) -> str:
    """The exact value of an arithmetic expression: integers stay integers (any size up to ``MAX_DIGITS``), ``/``
    and decimals use 50-digit decimal arithmetic. Anything else (names, calls, attributes) is a ``ToolError``."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {expression!r}: {e.msg}") from None

    def ev(node: ast.AST) -> int | Decimal:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value if isinstance(node.value, int) else Decimal(repr(node.value))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ToolError(f"exponent {right} is larger than {MAX_EXPONENT}")
            if isinstance(node.op, ast.Div) or isinstance(left, Decimal) or isinstance(right, Decimal):
                left, right = Decimal(left), Decimal(right)
            value = _BINARY[type(node.op)](left, right)
            if isinstance(value, int) and len(str(abs(value))) > MAX_DIGITS:
                raise ToolError(f"the result has more than {MAX_DIGITS} digits")
            return value
        raise ToolError(f"unsupported in an arithmetic expression: {ast.unparse(node)!r}")

    with localcontext() as ctx:
        ctx.prec = 50
        try:
            value = ev(tree)
        except (ZeroDivisionError, DivisionByZero, InvalidOperation):
            raise ToolError("division by zero") from None
    if isinstance(value, Decimal):
        value = value.normalize()
        return str(int(value)) if value == value.to_integral_value() else format(value, "f")
    return str(value)


def string_parameter(key: str, description: str) -> dict[str, Any]:
    """The JSON schema of an arguments object with one required string ``key``."""
    return {"type": "object", "properties": {key: {"type": "string", "description": description}}, "required": [key]}


def string_argument(tool: str, arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        raise ToolError(f"{tool} needs a string argument {key!r}")
    return value


class CalcTool(Tool):
    name = "calc"
    description = "Evaluate an arithmetic expression exactly (+ - * / // % ** and parentheses)."
    parameters = string_parameter("expression", "e.g. 123456 + 789012")

    async def call(self, arguments: dict[str, Any]) -> str:
        return evaluate_arithmetic(string_argument(self.name, arguments, "expression"))


# ---- python -------------------------------------------------------------------------------------------------------
_SANDBOX = (
    "import resource, sys\n"
    "mem = int(sys.argv[1]) * 2**20\n"
    "resource.setrlimit(resource.RLIMIT_AS, (mem, mem))\n"
    "resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[2]), int(sys.argv[2])))\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))\n"
    "code = sys.stdin.read()\n"
    "sys.stdin = None\n"
    "exec(compile(code, '<tool>', 'exec'), {'__name__': '__main__'})\n"
)


class PythonTool(Tool):
    """A snippet in a fresh, isolated interpreter (``-I``: no user site, no environment variables) under CPU-time,
    memory and open-file limits; the caller's deadline kills it on wall time. Not a security boundary against a
    hostile author (it can still read files the user can); it bounds what a policy's mistakes can cost."""

    name = "python"
    description = "Run a short Python program and return what it prints."
    parameters = string_parameter("code", "Python source; print the result")

    def __init__(self, memory_mb: int = 256, cpu_s: int = 5, max_output_chars: int = 4000):
        self.memory_mb, self.cpu_s, self.max_output_chars = memory_mb, cpu_s, max_output_chars

    async def call(self, arguments: dict[str, Any]) -> str:
        code = string_argument(self.name, arguments, "code")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            _SANDBOX,
            str(self.memory_mb),
            str(self.cpu_s),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate(code.encode())
        except BaseException:  # the deadline (CancelledError) or anything else: never leave the child running
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise ToolError(lines[-1] if lines else f"exited with code {proc.returncode} (CPU or memory limit)")
        return out.decode(errors="replace")[: self.max_output_chars]


BUILTIN_TOOLS: dict[str, type[Tool]] = {"calc": CalcTool, "python": PythonTool}


def build_tools(names: list[str]) -> dict[str, Tool]:
    """Tools by name: built-in names, or ``"package.module:ClassName"`` for a ``Tool`` subclass of the user's (built
    with no arguments)."""
    tools: dict[str, Tool] = {}
    for spec in names:
        if spec in BUILTIN_TOOLS:
            tool = BUILTIN_TOOLS[spec]()
        elif ":" in spec:
            module, _, attr = spec.partition(":")
            try:
                cls = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise ValueError(f"rollout.multi_turn.tools: cannot load {spec!r}: {e}") from None
            if not (isinstance(cls, type) and issubclass(cls, Tool)):
                raise ValueError(
                    f"rollout.multi_turn.tools: {spec!r} is not a subclass of asyncrl.rollout.agent.tools.Tool"
                )
            tool = cls()
        else:
            raise ValueError(
                f"rollout.multi_turn.tools: unknown tool {spec!r} (built-in: {sorted(BUILTIN_TOOLS)}, "
                "or 'package.module:ClassName')"
            )
        if not tool.name or tool.name in tools:
            raise ValueError(f"rollout.multi_turn.tools: {spec!r} has an empty or duplicate name {tool.name!r}")
        tools[tool.name] = tool
    return tools


def tool_schemas(names: list[str]) -> list[dict[str, Any]] | None:
    """The schemas of ``rollout.multi_turn.tools`` for the prompt's chat template (None without tools)."""
    return [t.schema() for t in build_tools(names).values()] if names else None


# ---- running calls -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and its arguments (``error`` set when the call did not parse)."""

    name: str
    arguments: dict[str, Any]
    error: str = ""


@dataclass(frozen=True)
class ToolResult:
    text: str
    ok: bool


async def _call_one(tools: dict[str, Tool], call: ToolCall, timeout_s: float) -> ToolResult:
    if call.error:
        return ToolResult(f"Error: {call.error}", False)
    tool = tools.get(call.name)
    if tool is None:
        return ToolResult(f"Error: no tool named {call.name!r} (tools: {', '.join(sorted(tools))})", False)
    try:
        return ToolResult(await asyncio.wait_for(tool.call(call.arguments), timeout_s), True)
    except TimeoutError:
        return ToolResult(f"Error: {call.name} timed out after {timeout_s:g} s", False)
    except ToolError as e:
        return ToolResult(f"Error: {e}", False)
    except Exception as e:  # a tool's bug must not end the rollout: the model sees it and the metrics count it
        return ToolResult(f"Error: {call.name} failed: {type(e).__name__}: {e}", False)


async def call_each(tools: dict[str, Tool], calls: list[ToolCall], timeout_s: float) -> list[ToolResult]:
    """One turn's calls at once, each under ``timeout_s``; results in call order."""
    return list(await asyncio.gather(*(_call_one(tools, c, timeout_s) for c in calls)))


def run_to_completion(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion from synchronous code, also from a thread whose event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="asyncrl-tools") as pool:  # a thread with no loop of its own
        return pool.submit(asyncio.run, coro).result()


def parse_arguments(raw: Any) -> dict[str, Any]:
    """A call's arguments as a dict: a JSON object, or a string holding one (both forms occur in the wild)."""
    if isinstance(raw, str):
        raw = json.loads(raw)
    if not isinstance(raw, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(raw).__name__}")
    return raw
