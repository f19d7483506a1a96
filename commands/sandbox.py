"""`crucible sandbox exec`: one command in a fresh sandbox, its ExecResult as JSON."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from commands.errors import UserError
from commands.settings import BACKEND_HELP, load_settings, sandbox_hosts
from sandbox.backends import BACKENDS, open_sandbox
from sandbox.base import SandboxUnavailable
from sandbox.spec import Limits, SandboxSpec


def command_sandbox_exec(args: argparse.Namespace) -> int:
    """Run one command in a fresh sandbox and print its ExecResult as JSON; exit 0 when the
    command succeeded (status OK), 1 otherwise."""
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UserError("no command given: crucible sandbox exec OPTIONS -- CMD ...")
    files = {}
    for path in args.file:
        try:
            files[Path(path).name] = Path(path).read_bytes()
        except OSError as e:
            raise UserError(f"--file {path}: {e.strerror}") from None
    limits = Limits(wall_s=args.timeout, cpu_s=max(1, math.ceil(args.timeout)), memory_mb=args.memory)
    spec = SandboxSpec(limits=limits, network=args.network)
    try:
        result = open_sandbox(args.backend, spec, sandbox_hosts(load_settings())).run(command, files)
    except SandboxUnavailable as e:
        raise UserError(f"the {args.backend} sandbox is unavailable: {e}") from None
    print(json.dumps(result.to_dict(), indent=2))
    return 0 if result.ok else 1


def add_commands(commands: argparse._SubParsersAction) -> None:
    sandbox = commands.add_parser("sandbox", help="run commands in a sandbox").add_subparsers(dest="action", required=True)
    execute = sandbox.add_parser("exec", help="run one command in a fresh sandbox; prints the ExecResult as JSON")
    execute.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    execute.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds (default 10)")
    execute.add_argument("--memory", type=int, default=512, help="memory limit in MB (default 512)")
    execute.add_argument("--network", action="store_true", help="give the command a network")
    execute.add_argument("--file", action="append", default=[], help="copy a file into the workspace (repeatable)")
    execute.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    execute.set_defaults(handler=command_sandbox_exec)
