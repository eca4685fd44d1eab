"""``atexit`` handlers run where a normal Python program runs them: a script's own handlers
before its failure status is set, and an actor's when its mesh stops gracefully."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import actormesh as am


def test_a_script_that_fails_still_runs_its_atexit_handlers(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        textwrap.dedent(
            """
            import atexit
            import actormesh as am
            atexit.register(lambda: print("the script's handler ran", flush=True))
            class A(am.Actor):
                @am.endpoint
                def boom(self):
                    raise RuntimeError("nobody is listening")
                @am.endpoint
                def ping(self):
                    return 1
            procs = am.this_host().spawn_procs(per_host={"gpus": 1})
            a = procs.spawn("a", A)
            a.boom.broadcast()
            try:
                a.ping.call_one().get(timeout=30)  # the broadcast's failure surfaces here
            except am.ActorError:
                pass
            """
        )
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert "actormesh: unhandled failure" in result.stderr
    assert result.returncode == 1
    assert "the script's handler ran" in result.stdout


class WritesAtExit(am.Actor):
    @am.endpoint
    def register_handler(self, path: str) -> None:
        import atexit

        def write() -> None:
            with open(path, "w") as f:
                f.write(str(am.current_rank()["gpus"]))

        atexit.register(write)


def test_an_actors_atexit_handlers_run_when_its_mesh_stops(tmp_path: Path) -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": 2})
    try:
        actors = procs.spawn("writes", WritesAtExit)
        for rank in range(2):
            actors.slice(gpus=rank).register_handler.call_one(str(tmp_path / f"rank{rank}")).get(
                timeout=30
            )
    finally:
        procs.stop().get(timeout=30)
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["0", "1"]
