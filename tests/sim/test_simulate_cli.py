"""``gm simulate`` end to end: flags, a scenario file, JSON output, a plot, replay hints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gm_core.sim import scenario, swarm
from gm_shell import cli, simulate_cli


def test_swarm_seed_runs_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--swarm", "3", "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["records"] > 0
    assert 0.0 <= summary["goodput"] <= 1.0


def test_scenario_file_in_toml_with_a_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.toml"
    path.write_text(
        'name = "toml run"\nlearners = 2\nduration_s = 20.0\npoll_s = 0.5\n'
        "[config]\nsync_every = 4\nfragments = 1\n"
        "[speed]\nstep_s = 0.5\n"
        '[training]\nmodel = "linear"\n'
    )
    png = tmp_path / "run.png"
    assert cli.main(["simulate", "--scenario", str(path), "--quiet", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "toml run" in out
    assert "invariants     all held" in out
    assert png.stat().st_size > 1000


def test_flags_save_a_scenario_that_replays_identically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "s.json"
    flags = ["--learners", "2", "--duration", "15", "--step-s", "0.5", "--quiet"]
    assert cli.main(["simulate", *flags, "--save", str(saved)]) == 0
    first = capsys.readouterr().out
    assert cli.main(["simulate", "--scenario", str(saved), "--quiet"]) == 0
    second = capsys.readouterr().out
    hash_line = [line for line in first.splitlines() if "trace hash" in line]
    assert hash_line
    assert hash_line[0] in second
    loaded = scenario.from_mapping(json.loads(saved.read_text()))
    assert loaded.learners == 2


def test_replay_command_names_the_non_default_flags() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["simulate", "--learners", "3", "--train"])
    assert simulate_cli.replay_command(args) == "gm simulate --learners 3 --train"
    args = parser.parse_args(["simulate", "--swarm", "9"])
    assert simulate_cli.replay_command(args) == "gm simulate --swarm 9"
    assert swarm.scenario(9).name == "swarm-9"
