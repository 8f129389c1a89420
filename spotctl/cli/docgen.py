"""Generate man pages, shell completions and the README command reference from the app.

Run ``python -m spotctl.cli.docgen`` (``make docs``); ``tests/test_docs.py``
fails when what is committed differs from what this produces.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import typer

from spotctl import __version__
from spotctl.core.errors import EXIT_CODE_HELP

ROOT = Path(__file__).resolve().parents[2]
PROG = "spotctl"
README_BEGIN = "<!-- BEGIN GENERATED: command reference (make docs) -->"
README_END = "<!-- END GENERATED: command reference -->"
MAN_DATE = "2026-11-29"  # fixed so that regenerating is reproducible; bump on release


def _root():
    from .main import app

    return typer.main.get_command(app)


def _is_arg(p) -> bool:
    return p.param_type_name == "argument"


def commands(group=None, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """Every leaf command as (path, command), in the app's order."""
    group = group or _root()
    out = []
    ctx = typer.Context(group, info_name=PROG)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        path = prefix + (name,)
        if hasattr(cmd, "list_commands"):
            if _params(cmd):  # a group that also runs on its own (exercise-reclaim --pool ...)
                out.append((path, cmd))
            out.extend(commands(cmd, path))
        else:
            out.append((path, cmd))
    return out


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace("-", "\\-").replace("'", "\\'")


def _opt_line(p) -> tuple[str, str]:
    if _is_arg(p):
        return p.name.upper(), ""
    names = ", ".join(p.opts + p.secondary_opts)
    if not getattr(p, "is_flag", False) and not getattr(p, "count", False):
        names += f" {getattr(p, 'metavar', None) or p.name.upper()}"
    return names, (getattr(p, "help", "") or "")


def _params(cmd) -> list:
    return [p for p in cmd.params if not getattr(p, "hidden", False)
            and p.name not in ("install_completion", "show_completion", "help")]


def _help(cmd) -> str:
    return (cmd.help or "").strip()


def _summary(text: str) -> str:
    """A command's summary: its help's first paragraph, whole (a sentence that wraps is not cut)."""
    return " ".join(text.split("\n\n", 1)[0].split()) if text else ""


def man_page(path: tuple[str, ...] | None, cmd) -> str:
    title = "-".join((PROG,) + (path or ()))
    name_line = f"{' '.join((PROG,) + (path or ()))}"
    text = _help(cmd)
    summary = _summary(text)
    lines = [
        f'.TH "{title.upper()}" "1" "{MAN_DATE}" "spotctl {__version__}" "spotctl manual"',
        ".SH NAME",
        f"{_esc(title)} \\- {_esc(summary)}",
        ".SH SYNOPSIS",
        f"\\fB{_esc(name_line)}\\fR [\\fIOPTIONS\\fR]" + (" \\fICOMMAND\\fR" if path is None else "")
        + "".join(f" \\fI{_esc(p.name.upper())}\\fR" for p in _params(cmd) if _is_arg(p)),
        ".SH DESCRIPTION",
    ]
    for para in text.split("\n\n"):
        lines.append(_esc(" ".join(para.split())))
        lines.append(".PP")
    params = _params(cmd)
    if params:
        lines.append(".SH OPTIONS")
        for p in params:
            name, helptext = _opt_line(p)
            lines += [".TP", f"\\fB{_esc(name)}\\fR", _esc(helptext or "")]
    if path is None:
        lines.append(".SH COMMANDS")
        for sub, c in commands():
            lines += [".TP", f"\\fB{_esc(' '.join((PROG,) + sub))}\\fR",
                      _esc(_summary(_help(c))) + f" See \\fB{_esc('-'.join((PROG,) + sub))}\\fR(1)."]
    lines.append(".SH EXIT STATUS")
    for code, meaning in EXIT_CODE_HELP.items():
        lines += [".TP", f"\\fB{int(code)}\\fR", _esc(meaning)]
    lines += [".SH ENVIRONMENT", ".TP", "\\fBSPOTCTL_CONFIG\\fR", "user configuration file",
              ".TP", "\\fBSPOTCTL_REGION\\fR", "default region", ".TP", "\\fBSPOTCTL_STATE_DIR\\fR",
              "state database directory", ".TP", "\\fBSPOTCTL_OUTPUT\\fR", "default output format",
              ".TP", "\\fBNO_COLOR\\fR", "disable colour"]
    lines += [".SH FILES", ".TP", "/etc/spotctl/config.toml", "system configuration",
              ".TP", "$XDG_CONFIG_HOME/spotctl/config.toml", "user configuration",
              ".TP", "$XDG_STATE_HOME/spotctl/REGION.db", "region state database (SQLite)"]
    if path is not None:
        lines += [".SH SEE ALSO", "\\fBspotctl\\fR(1)"]
    return "\n".join(lines) + "\n"


def completion(shell: str) -> str:
    from typer._completion_shared import get_completion_script

    return get_completion_script(prog_name=PROG, complete_var="_SPOTCTL_COMPLETE", shell=shell)


def readme_reference() -> str:
    parts = [README_BEGIN, ""]
    root = _root()
    parts.append("Global options (before the command): " + ", ".join(
        f"`{', '.join(p.opts)}`" for p in _params(root)) + ".")
    parts.append("")
    for path, cmd in commands():
        usage = " ".join((PROG,) + path)
        args = " ".join(p.name.upper() for p in _params(cmd) if _is_arg(p))
        text = _help(cmd)
        summary = _summary(text)
        example = next((ln.strip()[len("Example:"):].strip() for ln in text.splitlines() if ln.strip().startswith("Example:")), "")
        opts = [f"`{', '.join(p.opts)}`" for p in _params(cmd) if not _is_arg(p)]
        parts.append(f"- **`{usage}{(' ' + args) if args else ''}`** — {summary}"
                     + (f" Options: {', '.join(opts)}." if opts else "")
                     + (f" Example: `{example}`" if example else ""))
    parts += ["", README_END]
    return "\n".join(parts)


def generated() -> dict[Path, str]:
    files: dict[Path, str] = {ROOT / "man" / "spotctl.1": man_page(None, _root())}
    for path, cmd in commands():
        files[ROOT / "man" / f"spotctl-{'-'.join(path)}.1"] = man_page(path, cmd)
    files[ROOT / "completions" / "spotctl.bash"] = completion("bash")
    files[ROOT / "completions" / "_spotctl"] = completion("zsh")
    files[ROOT / "completions" / "spotctl.fish"] = completion("fish")
    return files


def readme_with_reference(text: str) -> str:
    pat = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pat.search(text):
        raise SystemExit("README.md lacks the generated command reference markers")
    return pat.sub(lambda _: readme_reference(), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if anything would change")
    args = ap.parse_args(argv)
    stale = []
    files = generated()
    readme = ROOT / "README.md"
    files[readme] = readme_with_reference(readme.read_text())
    for path, content in files.items():
        if not path.exists() or path.read_text() != content:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
    for f in (ROOT / "man").glob("*.1"):
        if f not in files:
            stale.append(f)
            if not args.check:
                f.unlink()
    if args.check and stale:
        print("stale generated files: " + ", ".join(str(p.relative_to(ROOT)) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
