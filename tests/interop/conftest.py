import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# `harness` sits beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Binaries, Proc, build  # noqa: E402


@pytest.fixture(scope="session")
def bins(tmp_path_factory: pytest.TempPathFactory) -> Binaries:
    """The proxy and the interop services, built once for the whole run."""
    return build(tmp_path_factory.mktemp("bin"))


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Every process a test starts, stopped at its end."""
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()
