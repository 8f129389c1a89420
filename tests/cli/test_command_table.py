"""The command table (``COMMANDS`` in spotctl/cli/main.py) and what keeps the CLI quick to start.

``spotctl --help`` lists the commands from the one-line helps in the table, without importing a command
module: these tests check that each of them is the command's own (so the table cannot drift from the
docstrings), that the listing is the one Typer itself would write, and that the command modules and
pydantic (which Typer would load for any option's value) stay unloaded where they are not needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
import typer
from typer import _click as click
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.core import TyperGroup

from spotctl.cli.main import COMMANDS, app
from spotctl.cli.options import PlainValues

BIN = Path(sys.executable).parent


def _first_paragraph(text: str) -> str:
    end = text.find("\n\n")
    return " ".join((text if end < 0 else text[:end]).split())


def _root():
    return typer.main.get_command(app)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_has_its_own_first_help_paragraph_in_the_table(name):
    entry = COMMANDS[name]
    assert len(entry) == 3, f"COMMANDS[{name!r}] has no one-line help: add the first paragraph of its help"
    cmd = _root().get_command(None, name)
    assert cmd is not None and not cmd.hidden and not cmd.short_help and not cmd.deprecated
    assert entry[2] == _first_paragraph(cmd.help or ""), f"COMMANDS[{name!r}]'s help differs from the command's"


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_the_command_list_is_the_one_typer_writes_from_the_loaded_commands(width):
    root = _root()
    ctx = click.Context(root, info_name="spotctl")
    ours, typers = click.HelpFormatter(width=width), click.HelpFormatter(width=width)
    root.format_commands(ctx, ours)
    TyperGroup.format_commands(root, ctx, typers)  # Typer's own: loads every command for its short help
    assert ours.getvalue() == typers.getvalue()
    assert all(name in ours.getvalue() for name in COMMANDS)


def _loaded_after(args: list[str], tmp_path: Path) -> dict:
    """Run spotctl in a fresh interpreter and report the modules loaded by the time it exits."""
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: sys.__stderr__.write('MODULES ' + json.dumps(sorted(sys.modules)) + '\\n'))\n"
            f"sys.argv = ['spotctl', *{args!r}]\n"
            "from spotctl.cli.entry import run\nrun()\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("SPOTCTL_CONFIG", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    line = next(x for x in p.stderr.splitlines() if x.startswith("MODULES "))
    return {"code": p.returncode, "modules": set(json.loads(line[len("MODULES "):])), "stdout": p.stdout}


def test_root_help_imports_no_command_module(tmp_path):
    out = _loaded_after(["--help"], tmp_path)
    assert out["code"] == 0 and "Commands:" in out["stdout"]
    commands = {f"spotctl.cli.{module}" for module, *_ in COMMANDS.values()}
    assert not commands & out["modules"]
    assert not {m for m in out["modules"] if m.split(".")[0] in ("pydantic", "rich", "sqlite_utils")}


@pytest.mark.parametrize("args", [["plan", "--help"], ["status", "-o", "json"], ["-o", "table", "-v", "status"],
                                  ["simulate", "--hours", "0.5", "--interval", "60"]])
def test_commands_run_without_pydantic(args, tmp_path):
    out = _loaded_after(args, tmp_path)
    assert out["code"] == 0
    assert "pydantic" not in out["modules"]


class Colour(str, Enum):
    red = "red"
    green = "green"


def _param(annotation, default=None, **info):
    def f(x=typer.Option(default, "--x", **info)):  # noqa: B008
        pass

    f.__annotations__["x"] = annotation
    sub = typer.Typer()
    sub.command()(f)
    cmd = typer.main.get_command(sub)
    return next(p for p in cmd.params if p.name == "x"), click.Context(cmd)


CASES = [
    (str, ["a", "", " spaced ", "ünï"]),
    (int, [0, 7, -3, "5", "-12", "007", "0"]),
    (float, [30.0, 0.0, "24", "2.5", "-1.25", "10"]),
    (Colour, ["red", "GREEN", Colour.red]),
]


@pytest.mark.parametrize("annotation,values", CASES)
def test_plain_values_are_the_values_typer_gives(annotation, values):
    extra = {"case_sensitive": False} if annotation is Colour else {}
    param, ctx = _param(annotation, **extra)
    full = build_runtime_param(param.type_descriptor)
    for v in values:
        ours, theirs = PlainValues().coerce(v, param, ctx), full.coerce(v, param=param, ctx=ctx)
        assert ours == theirs and type(ours) is type(theirs), v
    assert PlainValues().coerce(None, param, ctx) is None


@pytest.mark.parametrize("annotation,value,info", [
    (int, "x", {}), (int, "1.5", {}), (int, "0", {"min": 1}), (int, 99, {"max": 10}), (float, "nan", {}),
    (float, "inf", {"max": 5.0}), (Colour, "blue", {}), (int, " 5", {}), (int, "1_000", {}),
    (int, "9" * 5000, {}), (float, "1" * 400, {}),
])
def test_values_plain_parsing_cannot_tell_go_through_typer_with_its_errors(annotation, value, info):
    param, ctx = _param(annotation, **info)
    full = build_runtime_param(param.type_descriptor)
    try:
        theirs = full.coerce(value, param=param, ctx=ctx)
    except BadParameter as e:
        with pytest.raises(BadParameter) as ours:
            PlainValues().coerce(value, param, ctx)
        assert str(ours.value) == str(e) and type(ours.value.__cause__) is type(e.__cause__)
    else:
        assert repr(PlainValues().coerce(value, param, ctx)) == repr(theirs)  # nan too


def test_a_bad_global_value_still_says_what_typer_checked(cli):
    r = cli("-o", "xml", "status")
    assert r.code == 2
    assert "-o" in r.stderr or "--output" in r.stderr


@pytest.mark.parametrize("exc,code,line", [("Terminated()", 143, "spotctl: terminated"),
                                           ("KeyboardInterrupt()", 130, "spotctl: interrupted")])
def test_a_signal_while_typer_builds_the_root_command_ends_with_one_line(exc, code, line, tmp_path):
    """The moment between the imports (guarded by cli.entry) and the error site (SpotctlGroup.main): Typer
    building the root command. The signal is raised there, as its handler would."""
    script = ("import sys, typer.main\n"
              "from spotctl.core.errors import Terminated\n"
              "def build(app):\n"
              f"    raise {exc}\n"
              "typer.main.get_command = build\n"
              "sys.argv = ['spotctl', 'version']\n"
              "from spotctl.cli.main import run\nrun()\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "XDG_STATE_HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)})
    assert (p.returncode, p.stderr) == (code, line + "\n")
