"""``python -m actormesh COMMAND``: the command line.

python -m actormesh install-kernel [--user | --sys-prefix | --prefix PREFIX]
python -m actormesh run [--nproc-per-host N] script.py [script args...]
python -m actormesh host --connect HOST:PORT [--key-file FILE]   (a host agent; see actormesh.hosts)
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actormesh")
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser(
        "install-kernel", help='install the "actormesh" Jupyter kernelspec'
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for the current user")
    where.add_argument(
        "--sys-prefix", action="store_true", help=f"into this environment ({sys.prefix})"
    )
    where.add_argument("--prefix", help="under PREFIX/share/jupyter/kernels")
    install.add_argument("--name", default="actormesh", help="kernelspec name (actormesh)")
    commands.add_parser(
        "run", add_help=False, help="run a torchrun-style script: run --nproc-per-host N script ..."
    )
    commands.add_parser(
        "host", add_help=False, help="run a host agent that dials back: host --connect HOST:PORT"
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["host"]:
        from .hosts.agent_main import main as host_main

        return host_main(argv[1:])
    if argv[:1] == ["run"]:  # its own parser: the script's arguments must reach it untouched
        from .runtime.dataplane.spmd import main as run_main

        return run_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "install-kernel":
        from .kernel.spec import install as install_spec

        prefix = sys.prefix if args.sys_prefix else args.prefix
        try:
            path = install_spec(user=args.user, prefix=prefix, name=args.name)
        except (OSError, ValueError) as exc:
            print(f"install-kernel failed: {exc}", file=sys.stderr)
            if isinstance(exc, PermissionError):
                print("try --user or --sys-prefix", file=sys.stderr)
            return 1
        print(f"installed kernelspec {args.name!r} in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
