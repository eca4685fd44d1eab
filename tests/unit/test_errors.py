"""How errors name the ranks they are about."""

from __future__ import annotations

from actormesh.errors import ActorError, RemoteFailure


def _failure(rank: str, message: str = "boom") -> RemoteFailure:
    return RemoteFailure(rank, "counter", "incr", "ValueError", message, "Traceback ...\n")


def test_ranks_are_sorted_and_contiguous_ones_are_ranges() -> None:
    from actormesh.errors import format_ranks

    assert format_ranks(["{gpus=2}"]) == "rank gpus=2"
    assert format_ranks(["{gpus=3}", "{gpus=1}", "{gpus=0}", "{gpus=2}"]) == "ranks gpus=0-3"
    assert format_ranks(["{gpus=10}", "{gpus=2}", "{gpus=0}", "{gpus=1}"]) == ("ranks gpus=0-2,10")
    # Several dimensions: the last one as ranges, then equal rows merged.
    two = [f"{{hosts={h}, gpus={g}}}" for h in (1, 0) for g in (1, 0)]
    assert format_ranks(two) == "ranks hosts=0-1,gpus=0-1"
    odd = ["{hosts=0, gpus=0}", "{hosts=0, gpus=1}", "{hosts=1, gpus=1}"]
    assert format_ranks(odd) == "ranks hosts=0,gpus=0-1; hosts=1,gpus=1"
    # Labels without braces (worker output) and ones that are not coordinates at all.
    assert format_ranks(["gpus=1", "gpus=0"]) == "ranks gpus=0-1"
    assert format_ranks(["vm/10.0.0.1", "{gpus=0}"]) == "ranks gpus=0; vm/10.0.0.1"
    evens = format_ranks([f"{{gpus={g}}}" for g in range(0, 400, 2)])
    assert evens.startswith("ranks gpus=0,2,4,") and evens.endswith(", ... (200 ranks)")
    assert len(evens) < 130


def test_a_grouped_actor_error_lists_its_ranks_in_order_as_ranges() -> None:
    err = ActorError(
        [_failure(f"{{gpus={g}}}") for g in (3, 1, 0, 2)] + [_failure("{gpus=5}", "x")]
    )
    summary = str(err.args[0])
    assert summary.splitlines() == [
        "[ranks gpus=0-3] counter.incr raised ValueError: boom",
        "[rank gpus=5] counter.incr raised ValueError: x",
    ]
    assert "[ranks gpus=0-3] counter.incr raised ValueError: boom\nRemote traceback:" in str(err)
    assert "[ranks gpus=0-3] counter.incr" in err._render_traceback_()[0]
