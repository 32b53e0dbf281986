"""The optional extras install what their feature imports: ``pip install -e ".[grpc]"`` (the
first step of docs/deploy.md) must be enough for a gRPC run, which always aligns the party
programs' rows by the PSI."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def test_the_grpc_extra_brings_the_psi_it_runs():
    found = extras()
    assert set(found["psi"]) <= set(found["grpc"]), (found["psi"], found["grpc"])


def test_the_deploy_guide_installs_the_grpc_extra():
    guide = (ROOT / "docs" / "deploy.md").read_text()
    assert 'pip install -c constraints.txt -e ".[grpc]"' in guide
