"""The ``gm`` command line's conventions: usage errors, ``--version``, progress, summary lines."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from gm_core.check.explore import Bounds
from gm_shell import check_cli, cli
from gm_shell.demo import launch, layout

BAD_VALUES = [
    (["demo", "--alignment", "foo"], "--alignment: invalid choice: 'foo'"),
    (["demo", "--delta-format", "F12"], "--delta-format: invalid choice: 'F12'"),
    (["demo", "--learners", "0"], "--learners: expected an integer >= 1, got '0'"),
    (["demo", "--steps", "many"], "--steps: expected an integer >= 1, got 'many'"),
    (["demo", "--outer-momentum", "1.5"], "--outer-momentum: expected a number in [0, 1)"),
    (["demo", "--overlap-steps", "-1"], "--overlap-steps: expected an integer >= 0"),
    (["demo", "--name", "../elsewhere"], "--name: expected a folder name"),
    (["demo", "--learners", "2", "--quorum", "3"], "--quorum 3 exceeds the 2 learners"),
    (["check", "--roles", "xyz"], "--roles: expected node codes of l (learner) and c (closer)"),
    (["check", "--roles", ","], "--roles: expected node codes"),
    (["check", "--max-time", "nan"], "--max-time: expected a number > 0, got 'nan'"),
    (["check", "--replay", "zz:1"], "--replay: cannot read action 'zz:1'"),
    (["simulate", "--scenario", "no-such-file.toml"], "--scenario: no such file"),
    (["simulate", "--learners", "-3"], "--learners: expected an integer >= 1"),
    (["simulate", "--alignment", "sideways"], "--alignment: invalid choice"),
    (["status", "file:///nowhere", "--last", "0"], "--last: expected an integer >= 1"),
    (["status", "file:///nowhere", "--prices", "gcs"], "--prices: invalid choice"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_VALUES, ids=lambda v: " ".join(v))
def test_a_bad_value_is_a_usage_error_that_creates_nothing(
    argv: list[str],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)  # the demo's default --runs is relative: it would land here
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err
    assert captured.err.startswith(("usage: gm ", f"gm {argv[0]}: error: "))
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_a_malformed_scenario_file_is_a_usage_error_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("learners = 2\nwhat_is_this = 1\n")
    assert cli.main(["simulate", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gm simulate: error: invalid scenario")
    assert "what_is_this" in err
    path.write_text("learners = [")
    assert cli.main(["simulate", "--scenario", str(path)]) == 2
    assert capsys.readouterr().err.startswith("gm simulate: error: ")


def test_version_flag_and_subcommand_print_the_installed_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["--version"]) == 0
    flag = capsys.readouterr().out.strip()
    assert flag == f"gm-diloco {version('gm-diloco')}"
    assert cli.main(["version"]) == 0
    assert capsys.readouterr().out.strip() == flag


SIMULATE = ["simulate", "--learners", "2", "--duration", "15", "--step-s", "0.5"]


def test_progress_goes_to_stderr_only_on_a_terminal_or_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(SIMULATE) == 0  # capsys' stderr is not a terminal
    plain = capsys.readouterr()
    assert "\r" not in plain.out + plain.err
    assert "invariants" in plain.out
    assert cli.main([*SIMULATE, "--progress"]) == 0
    shown = capsys.readouterr()
    assert "\r[" in shown.err
    assert "\r" not in shown.out


def test_check_ends_a_set_of_bounds_with_one_summary_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = [
        check_cli.run(f"set {t}", Bounds(roles=("lc",), rounds=1, max_time_s=t), quiet=True)
        for t in (0.5, 1.0)
    ]
    capsys.readouterr()
    states = sum(o.states for o in small)
    assert all(o.verdict == "pass" for o in small)
    assert check_cli.summary_line(small) == f"2/2 bound sets PASS, {states:,} states"
    stopped = check_cli.run(
        "stopped", Bounds(roles=("lc",), rounds=1, max_time_s=1.0, max_states=5), quiet=True
    )
    assert stopped.verdict == "incomplete"
    line = check_cli.summary_line([*small, stopped])
    assert line == f"2/3 bound sets PASS, 1 INCOMPLETE, {states + stopped.states:,} states"


def test_the_demo_names_its_mailbox_and_the_status_command(tmp_path: Path) -> None:
    run = layout.RunDir(tmp_path / "demo")
    hint = launch.watch_hint(run)
    url = (tmp_path / "demo" / "mailbox").resolve().as_uri()
    assert re.fullmatch(rf"mailbox: {re.escape(url)}\nwatch it: gm status {re.escape(url)}\n", hint)


BLOCKER = """
import sys
class Absent:
    '''Makes the named top-level modules unimportable, as in an install without the extra.'''
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in sys.argv[1].split(','):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
sys.meta_path.insert(0, Absent())
from gm_shell import cli
sys.exit(cli.main(sys.argv[2:]))
"""


def without(modules: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``gm argv...`` in a fresh interpreter where ``modules`` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, modules, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_the_demo_names_its_extra_before_it_creates_anything(tmp_path: Path) -> None:
    done = without("torch,matplotlib", "demo", "--tiny", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        "gm demo: the demo needs torch and matplotlib, not installed here:"
        " pip install 'gm-diloco[demo]' (for the CPU-only torch wheel, first:"
        " pip install torch --index-url https://download.pytorch.org/whl/cpu)\n"
    )
    assert list(tmp_path.iterdir()) == []
    done = without("matplotlib", "demo", "--tiny", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        "gm demo: the demo needs matplotlib, not installed here: pip install 'gm-diloco[demo]'\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_plot_without_matplotlib_names_the_extra_before_simulating(tmp_path: Path) -> None:
    done = without("matplotlib", *SIMULATE, "--plot", "run.png", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        "gm simulate: --plot needs matplotlib, not installed here: pip install 'gm-diloco[plot]'\n"
    )
    assert done.stdout == ""
