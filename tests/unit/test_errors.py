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


def test_an_actor_error_starts_with_its_heading_not_a_blank_line() -> None:
    err = ActorError([_failure("{gpus=0}"), _failure("{gpus=1}", "x")])
    text = str(err)
    assert text.startswith("[rank gpus=0] counter.incr raised ValueError: boom\n"), text
    assert "\n\n" not in text and err.report() == text


def test_a_tensor_error_is_headed_by_its_op_not_the_engine() -> None:
    from actormesh.tensor import RemoteTensorError

    failure = RemoteFailure("{dp=1}", "tensor engine", "remote function clip", "ValueError",
                            "boom", "Traceback ...\n")  # fmt: skip
    err = RemoteTensorError([failure], "remote function clip", "train.py:12")
    assert str(err).startswith("[rank dp=1] remote function clip raised ValueError: boom\n")
    assert err._render_traceback_()[0].endswith(
        "remote function clip raised ValueError: boom\x1b[0m"
    )
    assert "tensor engine" not in str(err) and "issued at train.py:12" in str(err)
