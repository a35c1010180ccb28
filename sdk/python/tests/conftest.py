"""Fixtures for the tests that need the real proxy: the `sluice` binary, built once as
tests/interop builds it, and a running `sluice` on 127.0.0.1:0 started by the interop harness."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "interop"))

from harness import Binaries, Sluice, start_sluice  # noqa: E402


@pytest.fixture(scope="session")
def sluice_bin() -> Path:
    """The proxy, built (or found up to date) once per run; ``$SLUICE_BIN`` names a prebuilt
    one instead (e.g. a branch's debug binary), used as it is."""
    if prebuilt := os.environ.get("SLUICE_BIN"):
        return Path(prebuilt)
    cargo = ["cargo", "build", "--locked", "--quiet", "-p", "sluice-cli", "--bin", "sluice"]
    subprocess.run(cargo, cwd=REPO, check=True)
    return Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "debug" / "sluice"


@pytest.fixture
def sluice(sluice_bin: Path, tmp_path: Path) -> Iterator[Sluice]:
    """A running `sluice` with the interop configuration (reverse cluster `interop`, token
    `harness.TOKEN`), stopped after the test."""
    proxy = start_sluice(Binaries(sluice_bin, [], [], []), tmp_path)
    yield proxy
    proxy.proc.stop()
