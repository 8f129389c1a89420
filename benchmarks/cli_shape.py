"""The honest baseline of the CLI start benchmark: a bare Typer app generated from spotctl's own command tree.

:func:`shape` walks spotctl's Typer app (every command, sub-group and sub-command, in the order `--help`
lists them) and records what makes a Typer app cost what it costs to start and to show help: the help
texts and epilogs (the same strings), and each parameter's kind, option names, Python type, default,
flag/count/required, env var and help. :func:`bare_source` turns that into the source of a plain Typer app
that declares the same commands with the same parameters and help, in plain Typer style (one module, the
whole tree declared at import, the way Typer's docs write an app), with command bodies that do nothing,
except ``status`` (see :data:`STATUS_BODY`). Because the bare app is generated from spotctl's tree, a
command added to spotctl (``COMMANDS`` in spotctl/cli/main.py) is added to the baseline too.

Fairness: the bare app is written as a module (``bare_app.py``) with a two-line launcher like the
``spotctl`` console script, so that both are byte-compiled once and run from their ``.pyc``; both use
the same interpreter, Typer, ``rich_markup_mode=None`` (spotctl's: no rich for help) and
``-h/--help``. What the baseline lacks is spotctl's own code: callbacks that check values, shell
completion of values, the error site, and what spotctl does to start faster than plain Typer: it builds
only the sub-command called (its root help lists the others from ``COMMANDS``), and it takes option values
that need no parsing without Typer's pydantic-based coercion (``spotctl.cli.options.plain_values``), which
a plain Typer app pays for on any sub-command (pydantic's import). The ratios measure those savings
against what Typer costs when used as its docs show.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

#: The bare ``status``: the same work a trivial Typer sub-command that shows a small result would do. Off a
#: terminal (or -o json), the JSON envelope that ``spotctl status -o json`` printed in this run, parsed
#: from a constant and dumped again; with -o table, a rich table of the same pool rows and columns and the
#: same summary lines as spotctl's table (rich is what spotctl's table uses). It reads no config, opens
#: no database and builds no simulated region: that work is what spotctl's status is measured doing
#: against it.
STATUS_BODY = '''
    import sys
    doc = json.loads(STATUS_JSON)
    fmt = (ctx.find_root().obj or {}).get("output") or ("table" if sys.stdout.isatty() else "json")
    if fmt != "table":
        sys.stdout.write(json.dumps(doc, indent=2) + "\\n")
        return
    from rich.console import Console
    from rich.table import Table
    d = doc["data"]
    console = Console(width=160, highlight=False, soft_wrap=False)
    t = Table(title=f"Region {d['region']} ({d['backend']}): pools", title_justify="left")
    for col in ("pool", "kind, class", "az", "node shape", "price", "fit now", "ours/limit", "our nodes", "policy"):
        t.add_column(col, overflow="fold")
    for p in d["pools"]:
        t.add_row(p["name"], f"{p['kind']}, {p['class']}", p["az"], str(p["shape"]), str(p["price"]),
                  str(p["headroom"]), f"{p['nodes']}/{p['max_nodes']}", str(p["nodes_by_state"]), str(p.get("contract")))
    console.print(t)
    for k, v in d.items():
        if k not in ("pools", "nodes"):
            console.print(f"{k}: {str(v)[:100]}")
'''


def _param(p) -> dict[str, Any]:
    td = getattr(p, "type_descriptor", None)
    ann = td.annotation if td is not None else str
    default = p.default
    if isinstance(default, enum.Enum):
        default = {"enum": default.value}
    elif not isinstance(default, (type(None), bool, int, float, str)):
        default = None
    return {
        "kind": p.param_type_name, "name": p.name, "opts": list(p.opts) + list(p.secondary_opts),
        "type": (ann.__name__ if isinstance(ann, type) else "str"),
        "enum": [m.value for m in ann] if isinstance(ann, type) and issubclass(ann, enum.Enum) else None,
        "default": default, "required": p.required, "flag": bool(getattr(p, "is_flag", False)),
        "count": bool(getattr(p, "count", False)), "help": getattr(p, "help", None),
        "envvar": getattr(p, "envvar", None), "show_envvar": bool(getattr(p, "show_envvar", False)),
        "case_sensitive": getattr(td.parameter_info, "case_sensitive", True) if td is not None else True,
        "metavar": p.metavar,
    }


def _node(cmd, name: str) -> dict[str, Any]:
    params = [_param(p) for p in cmd.params if p.expose_value and p.name not in ("install_completion",
                                                                                 "show_completion")]
    node: dict[str, Any] = {"name": name, "help": cmd.help or "", "short_help": cmd.short_help,
                            "epilog": cmd.epilog, "params": params, "group": hasattr(cmd, "commands"),
                            "invoke_without_command": bool(getattr(cmd, "invoke_without_command", False))}
    if node["group"]:
        node["commands"] = [_node(cmd.get_command(None, n), n) for n in cmd.list_commands(None)]
    return node


def shape() -> dict[str, Any]:
    """spotctl's command tree, as data."""
    import typer

    from spotctl.cli.main import app

    return _node(typer.main.get_command(app), "spotctl")


def count_commands(node: dict[str, Any]) -> int:
    """Commands and groups below ``node`` (the root not counted)."""
    return sum(1 + count_commands(c) for c in node.get("commands", []))


def _ident(name: str, taken: dict[str, int]) -> str:
    base = "".join(c if c.isalnum() else "_" for c in name)
    taken[base] = taken.get(base, 0) + 1
    return f"{base}_{taken[base]}"


def _signature(params: list[dict[str, Any]], enums: dict[tuple, str]) -> str:
    out = ["ctx: typer.Context"]
    for p in params:
        if p["enum"]:
            key = tuple(p["enum"])
            enums.setdefault(key, f"Choice{len(enums)}")
            typ = enums[key]
        else:
            typ = p["type"] if p["type"] in ("bool", "int", "float", "str") else "str"
        default = p["default"]
        if isinstance(default, dict):
            dflt = f"{enums[tuple(p['enum'])]}({default['enum']!r})"
        else:
            dflt = repr(default)
        ann = f"Optional[{typ}]" if default is None and not p["required"] else typ
        kw = [f"help={p['help']!r}"] if p["help"] else []
        if p["count"]:
            kw.append("count=True")
        if p["envvar"]:
            kw.append(f"envvar={p['envvar']!r}")
        if p["show_envvar"] and p["envvar"]:
            kw.append("show_envvar=True")
        if p["enum"] and not p["case_sensitive"]:
            kw.append("case_sensitive=False")
        if p["metavar"] and p["kind"] == "option":
            kw.append(f"metavar={p['metavar']!r}")
        if p["kind"] == "argument":
            info = f"typer.Argument({', '.join(kw)})"
        else:
            info = f"typer.Option({', '.join(map(repr, p['opts']))}{''.join(', ' + k for k in kw)})"
        if p["required"]:
            out.append(f"{p['name']}: Annotated[{ann}, {info}]")
        else:
            out.append(f"{p['name']}: Annotated[{ann}, {info}] = {dflt}")
    return ",\n        ".join(out)


def _emit(node: dict[str, Any], parent: str, lines: list[str], enums: dict[tuple, str], taken: dict[str, int],
          path: str = "") -> None:
    for c in node.get("commands", []):
        fn = _ident(c["name"], taken)
        sig = _signature(c["params"], enums)
        here = f"{path} {c['name']}".strip()
        if c["group"]:
            sub = f"app_{fn}"
            lines.append(f"{sub} = typer.Typer(rich_markup_mode=None, add_completion=False, "
                         f"invoke_without_command={c['invoke_without_command']!r})")
            lines.append(f"{parent}.add_typer({sub}, name={c['name']!r}, help={c['help']!r}, epilog={c['epilog']!r})")
            if c["params"] or c["invoke_without_command"]:
                lines.append(f"@{sub}.callback(invoke_without_command={c['invoke_without_command']!r})")
                lines.append(f"def {fn}(\n        {sig}):\n    pass\n")
            _emit(c, sub, lines, enums, taken, here)
        else:
            body = STATUS_BODY if here == "status" else "\n    pass\n"
            lines.append(f"@{parent}.command({c['name']!r}, help={c['help']!r}, epilog={c['epilog']!r})")
            lines.append(f"def {fn}(\n        {sig}):{body}")


def bare_source(tree: dict[str, Any], status_json: str) -> str:
    """The source of the bare Typer app of ``tree``'s shape (module ``bare_app``, entry ``run()``)."""
    enums: dict[tuple, str] = {}
    taken: dict[str, int] = {}
    body: list[str] = []
    root_sig = _signature(tree["params"], enums)
    _emit(tree, "app", body, enums, taken)
    head = ["\"\"\"A bare Typer app of spotctl's shape (generated by benchmarks/cli_shape.py).\"\"\"",
            "import json", "from enum import Enum", "from typing import Annotated, Optional", "import typer", ""]
    for values, cls in enums.items():
        head.append(f"class {cls}(str, Enum):")
        head.extend(f"    v{i} = {v!r}" for i, v in enumerate(values))
        head.append("")
    head.append(f"STATUS_JSON = {status_json!r}")
    head.append(f"app = typer.Typer(help={tree['help']!r}, no_args_is_help=True, add_completion=True, "
                "rich_markup_mode=None, context_settings={'help_option_names': ['-h', '--help']})")
    head.append("@app.callback()")
    head.append(f"def main(\n        {root_sig}):\n"
                "    ctx.obj = {'output': output.value if output is not None else None}\n")
    tail = ["", "def run():", "    app(prog_name='bare')", ""]
    return "\n".join(head + body + tail)


def write_bare(directory: Path, status_json: str, tree: dict[str, Any] | None = None) -> list[str]:
    """Write ``bare_app.py`` and its launcher into ``directory``, byte-compile both ways of running it once,
    and return the launcher's file name (run it with the same interpreter as spotctl)."""
    import py_compile

    tree = tree or shape()
    mod = directory / "bare_app.py"
    mod.write_text(bare_source(tree, status_json))
    py_compile.compile(str(mod), doraise=True)
    launcher = directory / "bare"
    launcher.write_text(f"import sys\nsys.path.insert(0, {str(directory)!r})\nfrom bare_app import run\n"
                        "if __name__ == '__main__':\n    sys.exit(run())\n")
    return [str(launcher)]


if __name__ == "__main__":  # print the generated app, to read it
    print(bare_source(shape(), json.dumps({"data": {}})))
