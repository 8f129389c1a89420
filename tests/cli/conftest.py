from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from spotctl.cli.main import app


class Run:
    def __init__(self, result):
        self.result = result
        self.code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    @property
    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def cli(tmp_path):
    runner = CliRunner()

    def invoke(*args, env=None):
        return Run(runner.invoke(app, list(args), env=env, catch_exceptions=False))

    return invoke


@pytest.fixture
def state_db(tmp_path):
    return tmp_path / "xdg-state" / "spotctl" / "demo.db"
