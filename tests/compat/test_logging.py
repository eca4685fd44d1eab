"""docs/monarch.md: ``ProcMesh.logging_option`` and ``shutdown_context``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support import wait_until

from actormesh import Actor, current_rank, endpoint


class Printer(Actor):
    @endpoint
    def say(self, text: str, ranked: bool = False) -> None:
        print(f"{text} {current_rank()['gpus']}" if ranked else text, flush=True)


def test_logging_option(procs, capsys) -> None:
    printer = procs.spawn("printer", Printer)
    seen: list[str] = []

    def output() -> str:
        seen.append(capsys.readouterr().out)
        return "".join(seen)

    try:
        # The two ranks' lines must both arrive within one window to be shown once: 3 s leaves
        # room for a loaded machine (0.2 s did not, with a full test run beside it).
        procs.logging_option(stream_to_client=True, aggregate_window_sec=3).get()
        printer.say.call("alike").get()
        printer.say.call("apart", ranked=True).get()
        wait_until(lambda: "apart 1" in output(), 10, "the aggregated lines")
        lines = output().splitlines()
        assert sum("alike" in line for line in lines) == 1  # shown once, for both ranks
        assert any("2 ranks" in line and "alike" in line for line in lines)

        procs.logging_option(stream_to_client=False).get()
        printer.say.call("hidden").get()
        procs.logging_option(aggregate_window_sec=None).get()
        # From the same ranks, in order: once "shown" is here, "hidden" was handled before.
        printer.say.call("shown").get()
        wait_until(lambda: output().count("shown") == 2, 10, "the shown lines")
        assert "hidden" not in output()
    finally:
        procs.logging_option(aggregate_window_sec=None).get()
    with pytest.raises(ValueError):
        procs.logging_option(level=1000)


def test_shutdown_context(tmp_path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            import os
            from actormesh import Actor, SupervisionError, endpoint, shutdown_context, this_host

            class Pid(Actor):
                @endpoint
                def pid(self):
                    return os.getpid()

            procs = this_host().spawn_procs(per_host={"gpus": 2})
            pids = procs.spawn("pid", Pid).pid.call().get().values()
            shutdown_context().get()
            try:
                procs.spawn("again", Pid)
            except SupervisionError:
                print("closed", *pids)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    word, *pids = result.stdout.split()
    assert word == "closed"
    for pid in map(int, pids):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the workers are gone already
