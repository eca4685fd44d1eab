"""The SPMD entry point with real processes: an unmodified torchrun-style script
(examples/train_script.py) on a proc mesh; exit statuses; failing and dying ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import actormesh as am
from actormesh.runtime.actors.future import failed_future
from actormesh.runtime.dataplane import elastic_env, spmd
from actormesh.runtime.dataplane.rank_layout import RankLayout

SCRIPT = str(Path(__file__).parents[2] / "examples" / "train_script.py")
WAIT = 60  # seconds: every wait in this file is bounded

# What torchrun (torch.distributed.elastic's local agent) sets for every worker.
TORCHRUN_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}


def write(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def reports(prefix: Path, n: int) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{prefix}.{r}.json").read_text()) for r in range(n)]


def test_torchrun_env_has_every_torchrun_variable() -> None:
    env = elastic_env.torchrun_env(
        RankLayout(5, 8, 1, 4, 1, 2), "10.0.0.1", 4242, "run-1", True, "1"
    )
    assert set(env) == TORCHRUN_VARS | {"OMP_NUM_THREADS"}
    assert env["RANK"] == env["ROLE_RANK"] == "5"
    assert env["LOCAL_RANK"] == "1"
    assert env["GROUP_RANK"] == "1"
    assert env["ROLE_WORLD_SIZE"] == env["WORLD_SIZE"] == "8"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"  # the script's store is a client
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "4242")


def test_parser_takes_torchrun_spellings_and_leaves_script_args_alone() -> None:
    ns = spmd.parser().parse_args(
        ["--nproc_per_node", "3", "train.py", "--nproc-per-host", "9", "-m", "x"]
    )
    assert (ns.nproc, ns.script, ns.module) == (3, "train.py", False)
    assert ns.args == ["--nproc-per-host", "9", "-m", "x"]
    with pytest.raises(SystemExit):
        spmd.parser().parse_args(["--nproc-per-host", "0", "train.py"])


def test_train_script_runs_on_three_ranks(tmp_path: Path, capsys: Any) -> None:
    prefix = tmp_path / "report"
    args = [SCRIPT, "--steps", "3", "--report", str(prefix)]
    assert spmd.main(["--nproc-per-host", "3", "--run-id", "job7", *args]) == 0

    seen = reports(prefix, 3)
    ports = {s["env"]["MASTER_PORT"] for s in seen}
    assert len(ports) == 1
    for r, s in enumerate(seen):
        env = s["env"]
        assert (s["rank"], s["world"], s["name"]) == (r, 3, "__main__")
        assert s["argv"] == [SCRIPT, "--steps", "3", "--report", str(prefix)]
        assert (env["RANK"], env["LOCAL_RANK"], env["ROLE_RANK"]) == (str(r),) * 3
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("3", "3")
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert env["TORCHELASTIC_RUN_ID"] == "job7"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", "1")
        assert s["weight"] == seen[0]["weight"], "DDP keeps the replicas identical"

    out = capsys.readouterr().out
    for r in range(3):
        assert f"[procs={r}] rank {r} of 3 (local rank {r}) starts" in out
    assert "[procs=0] step 2 loss" in out
    assert "[procs=1] step" not in out  # only rank 0 prints the losses


def test_launch_runs_twice_on_one_mesh(spawn_procs: Any, tmp_path: Path) -> None:
    # Not train_script.py: re-running a DDP script in one process can deadlock inside torch
    # (a freed DDP reducer joins gloo's threads holding the GIL), with or without actormesh.
    script = write(
        tmp_path,
        "sums.py",
        """
        import os, sys
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")  # the second run must not see the first one's group
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        # A fresh store counts from zero (a port number can come back from the kernel).
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
        )
        runs = store.add("runs", 1)
        with open(f"{sys.argv[1]}.{dist.get_rank()}", "w") as f:
            f.write(f"{t.item()} {runs}")
        if sys.argv[2] == "keep":
            pass  # leave the group: the runner destroys it after a clean end
        else:
            dist.destroy_process_group()
        """,
    )
    procs = spawn_procs(per_host={"procs": 2})
    for attempt in ("keep", "destroy", "keep"):
        prefix = tmp_path / attempt
        codes = spmd.launch(procs, script, [str(prefix), attempt])
        assert codes.get(timeout=WAIT).values() == [0, 0]
        seen = [Path(f"{prefix}.{r}").read_text().split() for r in range(2)]
        assert [total for total, _ in seen] == ["3.0", "3.0"]
        assert sorted(runs for _, runs in seen) == ["1", "2"], "every run has a fresh store"


def test_sys_exit_status_comes_back_and_the_worker_survives(
    spawn_procs: Any, tmp_path: Path
) -> None:
    script = write(
        tmp_path,
        "exits.py",
        """
        import os, sys
        if __name__ == "__main__":
            sys.exit(3 if os.environ["RANK"] == "1" else None)
        """,
    )
    procs = spawn_procs(per_host={"procs": 2})
    assert spmd.launch(procs, script).get(timeout=WAIT).values() == [0, 3]
    assert procs.health().values() == ["alive", "alive"]
    assert spmd.main(["--nproc-per-host", "2", script]) == 3


def test_a_rank_that_dies_is_a_supervision_error(tmp_path: Path, capsys: Any) -> None:
    script = write(
        tmp_path,
        "dies.py",
        """
        import os
        if os.environ["RANK"] == "1":
            os._exit(7)
        """,
    )
    with pytest.raises(am.SupervisionError) as info:
        spmd.run(script, nproc_per_host=2, timeout=WAIT)
    assert info.value.exitcode == 7
    assert spmd.main(["--nproc-per-host", "2", script]) == 1
    assert "exited with code 7" in capsys.readouterr().err


def test_failing_script_exits_1_with_the_ranks_traceback(tmp_path: Path) -> None:
    # Rank 1 raises while rank 0 waits for it in a collective: like torchrun, the run fails
    # fast (rank 0 is stopped) instead of waiting for gloo's 30-minute timeout.
    script = write(
        tmp_path,
        "fails.py",
        """
        import torch
        import torch.distributed as dist

        def check(rank):
            if rank == 1:
                raise ValueError(f"rank {rank} found a bad batch")

        dist.init_process_group("gloo")
        print("joined", flush=True)
        check(dist.get_rank())
        dist.all_reduce(torch.ones(1))
        """,
    )
    result = subprocess.run(
        [sys.executable, "-m", "actormesh", "run", "--nproc-per-host", "2", script],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr
    assert "[rank hosts=0,procs=1] spmd.run raised ValueError: rank 1 found a bad batch" in err
    assert f'File "{script}", line 7, in check' in err
    assert "runpy" not in err  # the script's frames, not the launcher's
    assert "[procs=0] joined" in result.stdout and "[procs=1] joined" in result.stdout


def test_module_mode_runs_python_dash_m(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(
        tmp_path,
        "trainmod.py",
        """
        import os, sys
        with open(f"{sys.argv[1]}.{os.environ['RANK']}", "w") as f:
            f.write(f"{__name__} {sys.argv[2]}")
        """,
    )
    monkeypatch.chdir(tmp_path)  # like `python -m`, the module is found from the working dir
    prefix = tmp_path / "mod"
    assert spmd.run("trainmod", [str(prefix), "x"], nproc_per_host=2, module=True) == 0
    assert [Path(f"{prefix}.{r}").read_text() for r in range(2)] == ["__main__ x"] * 2


class SelfInit(am.Actor):
    """Monarch style: the actor calls init_process_group() itself, from the environment."""

    @am.endpoint
    def join_and_sum(self) -> tuple[int, float]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        return int(os.environ["LOCAL_RANK"]), t.item()


def test_setup_torch_elastic_env_lets_actors_init_themselves(spawn_procs: Any) -> None:
    procs = spawn_procs(per_host={"gpus": 3})
    elastic_env.setup_torch_elastic_env(procs)
    actors = procs.spawn("self_init", SelfInit)
    assert actors.join_and_sum.call().get(timeout=WAIT).values() == [(0, 6.0), (1, 6.0), (2, 6.0)]


def test_a_mesh_stopped_under_the_script_is_not_a_success(
    spawn_procs: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A MeshClosedError is a SupervisionError with no deaths: read as deaths, the run "ended"
    # with no death, no failure and no exit status, and returned 0.
    from actormesh.runtime.actors.future import Future

    class Closed:
        def __init__(self, mesh: Any) -> None:
            self.run = self

        def stream(self, *args: Any) -> Any:
            return self

        def next(self, timeout: float | None = None) -> Future[Any]:
            return failed_future(am.MeshClosedError("cannot call spmd.run: it was stopped"))

    real = spmd.helper_mesh
    monkeypatch.setattr(
        spmd,
        "helper_mesh",
        lambda mesh, name, cls: Closed(mesh) if name == "spmd" else real(mesh, name, cls),
    )
    procs = spawn_procs(per_host={"procs": 2})
    script = write(tmp_path, "noop.py", "pass\n")
    with pytest.raises(am.MeshClosedError, match="stopped"):
        spmd._run_on(procs, script, [], False, WAIT, None, None)
