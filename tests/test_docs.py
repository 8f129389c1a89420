"""Generated artefacts never drift: man pages, completions and the README command reference."""

from __future__ import annotations

from spotctl.cli import docgen


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
