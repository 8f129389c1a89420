"""Docs tested like the code (one file, because it is one thing: the docs say what the code does).

- Generated artefacts never drift: man pages, completions and the README command reference.
- Every key of the config schema (``spotctl.core.config.SCHEMA``) has a row in the reference of
  ``docs/operator-guide.md``, in the section of its table, with the type and range the schema gives it
  (and the default the typed view gives it, where one exists); no row documents a key the schema
  does not have.
- ``docs/architecture.md`` mentions every package under ``spotctl/`` and ``reconciler/``, and every
  module or path named in the docs exists; every link between the docs resolves, to a heading too.
- ``docs/wire-your-region.md`` is tested in ``tests/test_docs_wire_guide.py`` (its commands, its
  config, its RBAC manifest).

``python tests/test_docs.py`` prints the reference rows that are missing or whose type column is
wrong, ready to paste (the "what it does" column is for a person to write).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import fields
from functools import cache
from pathlib import Path

from spotctl.cli import docgen

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "operator-guide.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
WIRE = ROOT / "docs" / "wire-your-region.md"
CODE_ROOTS = ("spotctl", "reconciler")


# --- generated artefacts --------------------------------------------------------------------------


def test_man_pages_and_completions_are_up_to_date():
    stale = [str(p.relative_to(docgen.ROOT)) for p, content in docgen.generated().items()
             if not p.exists() or p.read_text() != content]
    assert not stale, f"regenerate with `make docs`: {stale}"
    committed = {p.name for p in (docgen.ROOT / "man").glob("*.1")}
    assert committed == {p.name for p in docgen.generated() if p.suffix == ".1"}


def test_readme_command_reference_is_up_to_date():
    readme = (docgen.ROOT / "README.md").read_text()
    assert docgen.readme_with_reference(readme) == readme, "regenerate with `make docs`"


def test_man_page_exit_status_comes_from_the_enum():
    from spotctl.core.errors import ExitCode

    page = (docgen.ROOT / "man" / "spotctl.1").read_text()
    for code in ExitCode:
        assert f"\\fB{int(code)}\\fR" in page


def test_readme_exit_code_table_lists_every_exit_code():
    from spotctl.core.errors import ExitCode

    section = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\|\s*(\d+)\s*\|", section, re.M)}
    assert documented == {int(c) for c in ExitCode}, (
        f"README's exit-code table: missing {sorted({int(c) for c in ExitCode} - documented)}, "
        f"not an exit code {sorted(documented - {int(c) for c in ExitCode})} (see spotctl/core/errors.py)")


def test_readme_starts_with_the_two_setup_commands():
    text = (docgen.ROOT / "README.md").read_text()
    blocks = text.split("```")
    first_code = blocks[1].splitlines()[1:]  # after the fence's info string
    commands = [ln for ln in first_code if ln.strip() and not ln.strip().startswith("#")]
    assert commands[:2] == ["make demo", "make test"]


def test_example_configs_load():
    from spotctl.core.config import load_config

    examples = sorted((docgen.ROOT / "docs" / "examples").glob("*.toml"))
    assert examples
    for path in examples:
        cfg = load_config(env={"SPOTCTL_CONFIG": str(path)})
        assert cfg.region().pools, path


# --- the configuration reference ------------------------------------------------------------------
# A reference section is a heading that names a table in backticks, "### `[regions.R.kafka]` — ...",
# or the heading "### Top level". Its rows: | `key` | type, range | default | what it does |.
# Placeholders in table names (R, P, NAME: any all-capital component) stand for "*" in the schema.
# A key of a nested table without "*" may be documented in its parent's section as a dotted key
# (`kubernetes.labels` in `[regions.R.pools.P]`).

ROOT_SECTION = "Top level"
_HEADING = re.compile(r"^(#{2,6})\s+(.*?)\s*$")
_TABLE_IN_HEADING = re.compile(r"`\[([A-Za-z0-9_.*-]*)\]`")
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


def schema_leaves() -> dict[tuple[str, ...], object]:
    """Every leaf of the schema: its path ("*" for a named entry) -> its Key."""
    from spotctl.core.config import SCHEMA, Key

    out: dict[tuple[str, ...], object] = {}

    def walk(schema: dict, path: tuple[str, ...]) -> None:
        for key, spec in schema.items():
            if isinstance(spec, Key):
                out[path + (key,)] = spec
            else:
                walk(spec, path + (key,))

    walk(SCHEMA, ())
    return out


def _number(v: float, key: str) -> str:
    v = int(v) if float(v).is_integer() else v
    if isinstance(v, float):
        return f"{v:g}"
    if key.endswith("_seconds") and v >= 86_400 and v % 86_400 == 0:
        return f"{v // 86_400} d"
    if v > 1 << 20 and v & (v + 1) == 0:
        return f"2^{(v + 1).bit_length() - 1} − 1"
    if v > 1 << 20 and v & (v - 1) == 0:
        return f"2^{v.bit_length() - 1}"
    if v >= 10**9 and str(v).rstrip("0") == "1":
        return f"10^{len(str(v)) - 1}"
    return f"{v:,}"


CHECK_WORDS = {
    "url": "http(s) URL",
    "hostports": "`host:port` list (comma-separated)",
    "token": "secret, one line, no spaces",
    "currency": "ISO 4217 code",
    "name": "name (no spaces, ≤ 253 characters)",
}


def type_cell(spec, key: str) -> str:
    """The "type, range" column of a key, generated from its schema leaf (the doc must say exactly this)."""
    if spec.choices:
        return "one of " + ", ".join(f"`{c}`" for c in spec.choices)
    if spec.check:
        return CHECK_WORDS[spec.check]
    t = spec.type
    word = {bool: "boolean", int: "integer", str: "string", list: "list of strings",
            dict: "table of strings"}.get(t, "number") if isinstance(t, type) else "number"
    n = lambda v: _number(v, key)  # noqa: E731
    lo, hi, gt = spec.lo, spec.hi, spec.gt
    if gt is not None:
        rng = f"> {n(gt)}" + (f", ≤ {n(hi)}" if hi is not None else "")
    elif lo is not None and hi is not None:
        rng = f"{n(lo)}–{n(hi)}"
    elif lo is not None:
        rng = f"≥ {n(lo)}"
    elif hi is not None:
        rng = f"≤ {n(hi)}"
    else:
        return word
    return f"{word}, {rng}"


def _cells(row: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


@cache
def guide_reference() -> dict[tuple[str, ...], dict[str, list[str]]]:
    """The guide's reference sections: table path ("*" for placeholders) -> key -> [type, default, what]."""
    sections: dict[tuple[str, ...], dict[str, list[str]]] = {}
    current: tuple[str, ...] | None = None
    level = 0
    for line in GUIDE.read_text().splitlines():
        h = _HEADING.match(line)
        if h:
            m = _TABLE_IN_HEADING.search(h.group(2))
            if m or h.group(2) == ROOT_SECTION:
                parts = tuple(p for p in (m.group(1).split(".") if m else []) if p)
                current = tuple("*" if _PLACEHOLDER.match(p) else p for p in parts)
                assert current not in sections, f"operator guide: two reference sections for [{'.'.join(current)}]"
                sections[current] = {}
                level = len(h.group(1))
            elif current is not None and len(h.group(1)) <= level:
                current = None
            continue
        if current is None or not line.lstrip().startswith("|"):
            continue
        cells = _cells(line)
        key = re.fullmatch(r"`([A-Za-z0-9_.]+|\*)`", cells[0])  # `*`: any name (a role of [identity.roles])
        if not key:
            continue  # the header row and the separator
        assert len(cells) == 4, f"operator guide [{'.'.join(current)}] row {cells[0]}: want 4 columns, got {cells}"
        assert key.group(1) not in sections[current], f"operator guide [{'.'.join(current)}]: {cells[0]} twice"
        sections[current][key.group(1)] = cells[1:]
    return sections


def documented() -> dict[tuple[str, ...], list[str]]:
    """Every documented key as a full schema path -> [type, default, what]."""
    out = {}
    for table, rows in guide_reference().items():
        for key, cells in rows.items():
            out[table + tuple(key.split("."))] = cells
    return out


def _dotted(path: tuple[str, ...]) -> str:
    """A table path as the guide writes it: regions.R.pools.P (R for a region, P for any other entry)."""
    return ".".join(("R" if i == 1 else "P") if p == "*" else p for i, p in enumerate(path)) or ROOT_SECTION


def _section_of(path: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The section a leaf belongs in, and its key there: its own table's, or its parent's with a dotted
    key when only the parent has a section (pools.P.kubernetes.labels -> [regions.R.pools.P] kubernetes.labels)."""
    table, sections = path[:-1], guide_reference()
    if table not in sections and len(table) > 4 and table[:-1] in sections:
        table = table[:-1]
    return table, ".".join(path[len(table):])


def _where(path: tuple[str, ...]) -> str:
    table, key = _section_of(path)
    return f"[{_dotted(table)}] `{key}`"


def test_operator_guide_documents_every_config_key():
    docs = documented()
    missing = [_where(p) for p in schema_leaves() if p not in docs]
    assert not missing, (f"{len(missing)} config keys have no row in docs/operator-guide.md's reference "
                         f"(`python tests/test_docs.py` prints them): {missing}")


def test_operator_guide_documents_no_key_the_schema_lacks():
    leaves = schema_leaves()
    extra = [_where(p) for p in documented() if p not in leaves]
    assert not extra, f"docs/operator-guide.md documents keys the config schema does not accept: {extra}"


def test_operator_guide_types_and_ranges_match_the_schema():
    leaves = schema_leaves()
    wrong = []
    for path, (typ, _default, what) in documented().items():
        if path in leaves:
            want = type_cell(leaves[path], path[-1])
            if typ != want:
                wrong.append(f"{_where(path)}: says {typ!r}, the schema says {want!r}")
            if len(what.split()) < 3:
                wrong.append(f"{_where(path)}: say what it does")
    assert not wrong, "docs/operator-guide.md's reference disagrees with spotctl/core/config.py:\n" + "\n".join(wrong)


def _literal(cell: str):
    """The value a default cell starts with: a backticked TOML value, or None for 'none'/'—'/'unset'."""
    m = re.match(r"`([^`]+)`", cell)
    if m:
        return tomllib.loads(f"v = {m.group(1)}")["v"]
    assert re.match(r"(none|unset|—)", cell, re.I), f"default {cell!r}: start with a `value`, or none/unset/—"
    return None


def test_operator_guide_defaults_match_the_typed_config():
    from spotctl.core.config import DEFAULTS, BudgetConfig, Policy

    want = {("regions", "*", "policy", f.name): f.default for f in fields(Policy)}
    want |= {("regions", "*", "budget", f.name): f.default for f in fields(BudgetConfig)}
    want |= {(k,): v for k, v in DEFAULTS.items() if not isinstance(v, dict)}
    docs = documented()
    wrong = [f"{_where(p)}: the guide says {docs[p][1]!r}, the code {v!r}"
             for p, v in want.items() if p in docs and _literal(docs[p][1]) != v]
    assert not wrong, "defaults in docs/operator-guide.md differ from spotctl/core/config.py:\n" + "\n".join(wrong)


def code_defaults() -> dict[tuple[str, ...], object]:
    """The defaults ``spotctl config show`` prints for the keys of a region's tables, by schema path."""
    from spotctl.core.config import POOL_DEFAULTS, REGION_DEFAULTS
    from spotctl.core.config_schema import SECTION_DEFAULTS

    out: dict[tuple[str, ...], object] = {("regions", "*", k): v for k, v in REGION_DEFAULTS.items()}
    out |= {("regions", "*", "pools", "*", k): v for k, v in POOL_DEFAULTS.items()}
    for name, values in SECTION_DEFAULTS.items():
        parts = tuple(name.split("."))
        table = ("regions", "*") + (parts + ("*",) if len(parts) > 1 else parts)
        out |= {table + (k,): v for k, v in values.items()}
    return out


#: Keys whose default the guide writes as what decides it at run time, not as a value.
RUN_TIME_DEFAULTS = {"cloud": "$OS_CLOUD", "actor": "USER@HOST", "kubeconfig": "$KUBECONFIG", "topic": "<region>",
                     "client_id": "<region>", "transactional_id": "<client_id>"}


def _documented_default(cell: str) -> object:
    """The value a default cell names: its first backticked TOML value (or word), None for none/unset/—."""
    m = re.search(r"`([^`]+)`", cell)
    if not m or re.match(r"(none|unset|—)", cell, re.I):
        return None
    try:
        return tomllib.loads(f"v = {m.group(1)}")["v"]
    except tomllib.TOMLDecodeError:
        return m.group(1)  # a path or a word: /var/run/secrets/..., PLAINTEXT


def test_operator_guide_defaults_match_what_config_show_prints():
    """Pools, regions and the adapter tables: the guide's default column is what the code applies."""
    want, docs = code_defaults(), documented()
    wrong = []
    for path, cells in docs.items():
        if len(path) < 3 or path[:2] != ("regions", "*") or path[2] in ("policy", "budget"):
            continue
        said, code = _documented_default(cells[1]), want.get(path)
        if isinstance(said, str) and path[-1] in RUN_TIME_DEFAULTS and RUN_TIME_DEFAULTS[path[-1]] in cells[1]:
            continue
        if said != code:
            wrong.append(f"{_where(path)}: the guide says {cells[1]!r}, the code {code!r}")
    assert not wrong, ("defaults in docs/operator-guide.md differ from spotctl/core/config.py and "
                       "SECTION_DEFAULTS in spotctl/core/config_schema.py:\n" + "\n".join(wrong))


def test_operator_guide_names_every_environment_variable():
    from spotctl.core.config import ENV_KEYS

    text = GUIDE.read_text()
    missing = [v for v in (*ENV_KEYS, "SPOTCTL_CONFIG", "SPOTCTL_SYSTEM_CONFIG") if f"`{v}`" not in text]
    assert not missing, f"docs/operator-guide.md does not name {missing}"


# --- modules, packages and paths ------------------------------------------------------------------

# `spotctl/ops/relay.py`, `spotctl/sim/`, `reconciler/main.py`, `tests/unit/test_planner.py`, ...
_PATH = re.compile(r"(?<![\w./@<>-])((?:spotctl|reconciler|tests|docs|benchmarks|contrib|scripts|man|completions)"
                   r"/[\w./@<>{}*-]*)")
# `spotctl.core.deadline`, `spotctl.core.contract.notice_term` (not spotctl.io/…, io.spotctl.…, spotctl.1)
_DOTTED = re.compile(r"(?<![\w./-])((?:spotctl|reconciler)(?:\.[A-Za-z_]\w*)+)(?![\w/-])")


def packages() -> list[str]:
    """Every package under spotctl/ and reconciler/ (a directory with an __init__.py), as 'spotctl/x/'."""
    out = []
    for top in CODE_ROOTS:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            out.append(init.parent.relative_to(ROOT).as_posix() + "/")
    return out


@cache
def _top_level_names(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def resolves(dotted: str) -> bool:
    """Whether ``spotctl.a.b[.name]`` is a module or package, or a top-level name in one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        module = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
        if module.exists():
            rest = parts[i:]
            return not rest or rest[0] in _top_level_names(module)
    return False


def path_exists(ref: str) -> bool:
    """Whether a repository path named in a doc exists (up to its first placeholder: <x>, {x}, *)."""
    ref = ref.rstrip(".,;:)")
    fixed = re.split(r"[<{*]", ref, maxsplit=1)[0]
    if fixed != ref:
        return (ROOT / fixed.rsplit("/", 1)[0]).exists()
    return (ROOT / ref).exists()


def named_in(text: str) -> tuple[list[str], list[str]]:
    return ([m.group(1) for m in _PATH.finditer(text)], [m.group(1) for m in _DOTTED.finditer(text)])


def test_architecture_mentions_every_package():
    text = ARCHITECTURE.read_text()
    paths, dotted = named_in(text)
    mentioned = {p.rstrip(".,;:)").rstrip("/") for p in paths} | {d.replace(".", "/") for d in dotted}
    missing = [p for p in packages() if p.rstrip("/") not in mentioned]
    assert not missing, f"docs/architecture.md does not say what these packages are for: {missing}"


def test_docs_name_only_modules_and_paths_that_exist():
    bad = []
    for doc in (ARCHITECTURE, GUIDE, README, WIRE):
        paths, dotted = named_in(doc.read_text())
        bad += [f"{doc.relative_to(ROOT)}: {p}" for p in paths if not path_exists(p)]
        bad += [f"{doc.relative_to(ROOT)}: {d}" for d in dotted if not resolves(d)]
    assert not bad, f"the docs name modules or files that do not exist: {bad}"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    return {slug(m.group(2)) for m in map(_HEADING.match, text.splitlines()) if m}


_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: Documents that live outside this repository and must not be cited (the design lives in the docs here).
_CITABLE = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")


def test_links_between_the_docs_resolve():
    docs = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    bad = []
    for doc in docs:
        for target in _LINK.findall(re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            file, _, anchor = target.partition("#")
            dest = (doc.parent / file).resolve() if file else doc
            if not dest.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such heading in {dest.name})")
    assert not bad, f"broken links in the docs: {bad}"


def test_docs_cite_only_documents_in_the_repository():
    """A `NAME.md` the docs, the API documents or the units cite exists here (DESIGN.md does not)."""
    known = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts and "node_modules" not in p.parts}
    sources = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "docs").rglob("*.yaml")),
               *sorted((ROOT / "contrib").rglob("*.service"))]
    bad = [f"{p.relative_to(ROOT)}: {name}" for p in sources for name in _CITABLE.findall(p.read_text())
           if name not in known]
    assert not bad, f"the docs cite documents that are not in the repository: {bad}"


def test_the_checks_catch_what_they_should():
    """The reference parser and the module resolver are not vacuous."""
    assert ("regions", "*", "kafka", "bootstrap_servers") in schema_leaves()
    assert len(schema_leaves()) > 100
    assert resolves("spotctl.core.config") and resolves("spotctl.core.config.SCHEMA") and resolves("spotctl.core")
    assert not resolves("spotctl.foo") and not resolves("spotctl.core.config.NO_SUCH_NAME")
    assert path_exists("spotctl/core/config.py") and not path_exists("spotctl/foo.py")
    assert named_in("see `spotctl/foo.py` and spotctl.foo, not spotctl.io/reclaim nor io.spotctl.node") == (
        ["spotctl/foo.py"], ["spotctl.foo"])
    assert "spotctl/services/" in packages() and "reconciler/" in packages()
    assert slug("`[regions.R.kafka]` — lifecycle events") == "regionsrkafka--lifecycle-events"
    assert "configuration-reference" in anchors(GUIDE)
    assert _CITABLE.findall("Contract terms (DESIGN.md §3), see docs/operator-guide.md") == ["DESIGN.md"]


def missing_rows() -> str:
    """The reference rows to add or fix, grouped by section, for a person to complete."""
    leaves, docs = schema_leaves(), documented()
    out: dict[str, list[str]] = {}
    for path, spec in leaves.items():
        want = type_cell(spec, path[-1])
        if path not in docs or docs[path][0] != want:
            table, key = _section_of(path)
            out.setdefault(_dotted(table), []).append(f"| `{key}` | {want} | ? | ? |")
    return "\n\n".join(f"### `[{t}]`\n\n| key | type, range | default | what it does |\n|---|---|---|---|\n"
                        + "\n".join(rows) for t, rows in out.items())


if __name__ == "__main__":
    print(missing_rows() or "every key is documented")


# --- the metrics the operator guide names ---------------------------------------------------------


def test_every_metric_expression_in_the_operator_guide_names_exported_metrics_and_labels():
    """The runbooks' signals are PromQL (inline code naming a ``spotctl_`` metric): each parses, and names
    only series spotctl exports, with labels their family has (the check tests/test_grafana.py makes of the
    dashboard)."""
    import promql_parser

    from spotctl.core.metrics import BY_NAME, exported_sample_names
    from tests.test_grafana import family_of, selectors

    prose = re.sub(r"```.*?```", "", GUIDE.read_text(), flags=re.S)
    spans = [m.replace("\n", " ") for m in re.findall(r"`([^`]*\bspotctl_[a-z_]+[^`]*)`", prose)]
    exprs = [s for s in spans if not s.startswith(("spotctl ", "spot-reconciler "))]
    assert len(exprs) >= 25, exprs
    exported = exported_sample_names()
    for expr in exprs:
        sample = re.fullmatch(r"(\S+?(?:\{[^}]*\})?) [-+\d.e]+", expr)  # a sample as exposed: `name{labels} 1`
        tree = promql_parser.parse(sample.group(1) if sample else expr)  # raises on a syntax error
        for name, labels in selectors(tree):
            f = family_of(name) or BY_NAME.get(name)  # a histogram may be named by its family
            assert f is not None and (name in exported or f.type == "histogram"), (
                f"docs/operator-guide.md: {name} (in {expr!r}) is not a metric spotctl exports")
            allowed = {"region", *f.labels} | ({"le"} if name.endswith("_bucket") else set())
            assert labels <= allowed, f"docs/operator-guide.md: {name} has no label(s) {sorted(labels - allowed)}"
