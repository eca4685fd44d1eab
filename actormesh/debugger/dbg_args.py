"""The words of a ``%mesh dbg`` command line: which command, its options, the rest (pure)."""

from __future__ import annotations

from ..kernel.magic_args import usage
from .session import STEP_COMMANDS

COMMANDS = ("list", "where", "eval", *STEP_COMMANDS, "pause", "wait", "break", "inspect", "on",
            "off", "widget")  # fmt: skip


class DbgArgs:
    """``-r SEL``, ``-m TARGET``, ``-f FRAME``, ``-t S``, ``--clear`` and the remaining words."""

    def __init__(self, command: str, rest: list[str]) -> None:
        self.command = command
        self.ranks: str | None = None
        self.mesh: str | None = None
        self.frame = 0
        self.timeout = 60.0
        self.clear = False
        self.words: list[str] = []
        it = iter(rest)
        for tok in it:
            # eval's options come before EXPR (which may hold a "-"); elsewhere anywhere
            option_here = command != "eval" or not self.words
            if tok in ("-r", "--ranks", "-m", "--mesh", "-f", "--frame", "-t", "--timeout") and (
                option_here
            ):
                value = next(it, None)
                if value is None:
                    raise usage(f"%mesh dbg {command}: {tok} needs a value")
                if tok in ("-r", "--ranks"):
                    self.ranks = value
                elif tok in ("-m", "--mesh"):
                    self.mesh = value
                elif tok in ("-t", "--timeout"):
                    try:
                        self.timeout = float(value)
                    except ValueError:
                        raise usage(f"%mesh dbg {command}: -t needs seconds, got {value}") from None
                else:
                    if not value.isdigit():
                        raise usage(f"%mesh dbg {command}: -f needs a frame number, got {value}")
                    self.frame = int(value)
            elif tok == "--clear" and command == "break":
                self.clear = True
            elif tok.startswith("-") and command != "eval":
                raise usage(f"%mesh dbg {command}: unknown option {tok!r}")
            else:
                self.words.append(tok)
