"""Running a torchrun-style script as ``__main__`` in a worker process: ``ScriptRunner`` (the
actor ``actormesh run`` spawns on each rank), and what ``SPMDActor`` shares with it: the exit
status of ``sys.exit``, a traceback that starts at the script's own frames, and leaving the
process group a script formed so that the next script can form its own.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from types import TracebackType

from ..actors import Actor, context, endpoint

logger = logging.getLogger(__name__)


def exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # sys.exit("message"): printed, status 1, as Python does
    return 1


def script_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading frames from this module and runpy: from the script's on."""
    first = tb
    launcher = {"<frozen runpy>", runpy.__file__}
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename not in launcher and frame.f_globals.get("__name__") != __name__:
            break
        tb = tb.tb_next
    return tb or first


class ScriptRunner(Actor):
    """Runs a script (or module) as ``__main__`` in this process with torchrun's environment."""

    @endpoint
    def run(
        self, target: str, args: list[str], envs: list[dict[str, str]], module: bool
    ) -> tuple[int, int]:
        import torch

        rank = context().message_rank.rank
        env = envs[rank]
        saved_env = {k: os.environ.get(k) for k in env}
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        saved_threads = torch.get_num_threads()
        os.environ.update(env)
        if "OMP_NUM_THREADS" in env:
            # torch was imported before the variable was set (the fork server preloads it).
            torch.set_num_threads(max(1, int(env["OMP_NUM_THREADS"])))
        sys.argv = [target, *args]
        clean, failure = False, None
        try:
            if module:
                sys.path.insert(0, os.getcwd())
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
                runpy.run_path(target, run_name="__main__")
            code, clean = 0, True
        except SystemExit as exc:
            code, clean = exit_code(exc), True
        except BaseException as exc:
            failure = exc.with_traceback(script_frames(exc.__traceback__))
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            torch.set_num_threads(saved_threads)
            if clean:
                leave_quietly()
        if failure is not None:
            raise failure  # the script's own exception, shown from the script's frames on
        return rank, code


def leave_quietly() -> None:
    """Destroy the group a script left behind, so the next script can form its own. Only after
    a clean end: with a collective still queued on a failed rank, destroying could block."""
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        logger.warning("could not destroy the process group the script left", exc_info=True)
