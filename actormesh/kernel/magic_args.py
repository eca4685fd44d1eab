"""The line of ``%%mesh`` parsed, and the one-line errors every magic raises for a bad line
(pure: nothing here runs a cell or talks to a mesh)."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError


def usage(message: str) -> UsageError:
    """A mistake in a magic's line: one line, no traceback (IPython shows a UsageError so)."""
    return UsageError(" ".join(message.split()))


def identifier(name: str, what: str) -> str:
    if not name or not name.isidentifier():
        raise usage(f"{what} must be a Python name, got {name!r}")
    return name


class CellArgs:
    """The parsed line of ``%%mesh TARGET [--ranks SEL] [--noblock] [--timeout S]
    [--no-dedup] [-o NAME]``."""

    def __init__(self, line: str) -> None:
        try:
            tokens = shlex.split(line)
        except ValueError as exc:
            raise usage(f"%%mesh: cannot parse {line!r}: {exc}") from None
        target: list[str] = []
        self.ranks: str | None = None
        self.noblock = False
        self.timeout: float | None = None
        self.dedup = True
        self.output = "_mesh"
        it = iter(tokens)
        for tok in it:
            if tok in ("--ranks", "-r", "--timeout", "-o", "--out"):
                value = next(it, None)
                if value is None:
                    raise usage(f"%%mesh: {tok} needs a value")
                if tok in ("--ranks", "-r"):
                    self.ranks = value
                elif tok == "--timeout":
                    try:
                        self.timeout = float(value)
                    except ValueError:
                        raise usage(f"%%mesh: --timeout needs seconds, got {value!r}") from None
                    if not self.timeout > 0:
                        raise usage(f"%%mesh: --timeout must be > 0, got {value}")
                else:
                    self.output = identifier(value, "%%mesh -o")
            elif tok.startswith("--ranks="):
                self.ranks = tok.split("=", 1)[1]
            elif tok == "--noblock":
                self.noblock = True
            elif tok == "--no-dedup":
                self.dedup = False
            elif (tok.startswith("-") and not target) or tok.startswith("--"):
                raise usage(f"%%mesh: unknown option {tok!r}")
            else:
                target.append(tok)
        self.target = " ".join(target)
        if not self.target:
            raise usage("%%mesh needs a TARGET: a ProcMesh or ActorMesh, e.g. %%mesh procs")
