"""mypy checks endpoint calls on an ``ActorMesh[T]`` against ``T``'s ``@endpoint`` methods (with
the plugin ``actormesh.mypy_plugin``): the expected errors of ``typing_endpoints.py``, and no
other."""

from __future__ import annotations

import pathlib
import re

import pytest

mypy_api = pytest.importorskip("mypy.api")

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
CHECKED = HERE / "typing_endpoints.py"


def expected_errors() -> set[tuple[int, str]]:
    out = set()
    for number, line in enumerate(CHECKED.read_text().splitlines(), 1):
        marker = re.search(r"# E: ([a-z-]+)$", line)
        if marker:
            out.add((number, marker.group(1)))
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_endpoint_calls_are_checked_against_the_actor_class(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "mypy.ini"
    config.write_text(
        "[mypy]\n"
        "plugins = actormesh.mypy_plugin\n"
        "ignore_missing_imports = true\n"
        "follow_imports = silent\n"  # errors of actormesh itself are the project run's job
        "warn_unused_ignores = true\n"
        # Big libraries the runtime imports: not needed to type an endpoint, slow to analyse.
        "[mypy-torch.*,numpy.*,IPython.*,ipykernel.*,jupyter_client.*,debugpy.*]\n"
        "follow_imports = skip\n"
    )
    # The actormesh of this checkout, whichever one is installed.
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    stdout, stderr, _ = mypy_api.run(
        [
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--show-error-codes",
            "--no-error-summary",
            str(CHECKED),
        ]
    )
    assert not stderr, stderr
    got = set()
    for line in stdout.splitlines():
        if ": note: " in line:
            continue
        found = re.match(r".*typing_endpoints\.py:(\d+): error: .*\[([a-z-]+)\]$", line)
        assert found, f"unexpected mypy output: {line}"
        got.add((int(found.group(1)), found.group(2)))
    expected = expected_errors()
    assert len(expected) == 10
    assert got == expected, stdout
