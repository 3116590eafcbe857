"""Bad command-line arguments get one clear line (argparse's usage and error), never a traceback."""

from __future__ import annotations

import pytest

from kafka_batch.cli.commands import build_parser

REPLAY = ["replay", "--pipeline", "p", "--topic", "t"]


@pytest.mark.parametrize(("args", "message"), [
    (REPLAY + ["--partitions", "a"], "comma-separated partition numbers, got 'a'"),
    (REPLAY + ["--partitions", "0,-1"], "partition numbers are >= 0"),
    (REPLAY + ["--from", "-5", "--until", "3"], "an offset is >= 0, got -5"),
    (REPLAY + ["--from", "x", "--until", "3"], "an offset is a whole number, got 'x'"),
    (["reset", "--pipeline", "p", "--topic", "t", "--reason", "r", "--to-offset", "-1"], "an offset is >= 0"),
    (["batches", "--pipeline", "p", "--last", "0"], "a count is >= 1, got 0"),
    (["quarantine", "--pipeline", "p", "--last", "many"], "a count is a whole number, got 'many'"),
])
def test_bad_arguments_are_one_clear_error(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert [line for line in err.splitlines() if "error:" in line] == [line for line in err.splitlines()
                                                                        if message in line]


def test_good_arguments_are_parsed():
    args = build_parser().parse_args(REPLAY + ["--partitions", "0,2", "--from", "0", "--until", "10"])
    assert (args.partitions, args.from_offset, args.until_offset) == ((0, 2), 0, 10)
    assert build_parser().parse_args(["status", "--pipeline", "p", "--json"]).json
    assert build_parser().parse_args(["batches", "--pipeline", "p", "--last", "3", "--json"]).last == 3
    assert not build_parser().parse_args(["run", "--pipeline", "p"]).verbose


def test_version_is_the_installed_distributions(capsys):
    import tomllib

    from kafka_batch.config import PROJECT_ROOT

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    declared = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"kafka-batch {declared}"
