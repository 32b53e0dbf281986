"""``python -m vfl_lightning.data.export`` as a new user meets it: every bad override or ``--out``
is one ``error:`` line naming it (train.py's wording), exit 2, and nothing is written."""

from __future__ import annotations

import pytest

from vfl_lightning.data.export import main

DATA_OPTIONS = "the options are breast_cancer, caltech7, cifar10"


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    captured = capsys.readouterr()
    line = captured.err.strip()
    assert line.startswith("error: ") and "\n" not in line, captured.err
    assert captured.out == ""
    return line.removeprefix("error: ")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("sed=3", "sed is not a config key (the root config takes algo, "),
        ("sed=3", "did you mean seed=3?"),
        ("data.foo=1", "data.foo is not a config key (data=digits takes active_party, "),
        ("data=foo", f"data=foo is not an option of data: {DATA_OPTIONS}"),
        ("data.num_parties=abc", "data.num_parties must be an integer >= 1, got 'abc'"),
        ("data.overlap=2", "data.overlap must be a number in (0, 1]"),
        ("seed=abc", "seed must be an integer in [0, 2^32 - 1], got 'abc'"),
        ("data.num_parties=[1", "data.num_parties=[1 opens 1 '[' but closes 0 ']'"),
        ("+data.seed=1", "+data.seed=1 adds data.seed, which the config already has"),
    ],
)
def test_a_bad_override_is_one_line_naming_it_and_nothing_is_written(
    tmp_path, capsys, override, expected
):
    out = tmp_path / "files"
    line = refused(capsys, "data=digits", override, "--out", str(out))
    assert expected in line
    assert not out.exists()


def test_an_out_that_cannot_be_a_new_directory_is_named(tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("")
    line = refused(capsys, "data=digits", "--out", str(used))
    assert line == f"--out {used} exists and is not an empty directory; choose a new one"
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    line = refused(capsys, "data=digits", "--out", str(a_file / "files"))
    assert line == (
        f"--out {a_file / 'files'} cannot be used: {a_file} is a file; choose a new directory "
        "you can write"
    )


def test_an_unwritable_out_is_named_before_the_data_is_built(tmp_path, capsys, monkeypatch):
    from vfl_lightning.data import export

    def built(*args, **kwargs):
        raise AssertionError("the data was built before --out was checked")

    monkeypatch.setattr(export.os, "access", lambda path, mode: False)
    monkeypatch.setattr(export, "write", built)
    line = refused(capsys, "data=digits", "--out", str(tmp_path / "files"))
    assert line == (
        f"--out {tmp_path / 'files'} cannot be used: {tmp_path} is not writable; choose a new "
        "directory you can write"
    )


def test_a_write_that_fails_names_out(tmp_path, capsys, monkeypatch):
    from vfl_lightning.data import export

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "write_party_files", full)
    line = refused(capsys, "data=breast_cancer", "data.num_parties=2", "--out", str(tmp_path / "o"))
    assert line == (
        f"--out {tmp_path / 'o'} cannot be used: No space left on device; choose a new directory "
        "you can write"
    )


def test_bad_flags_and_help(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["data=digits"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "error: the following arguments are required: --out (see --help)\n"
    )
    with pytest.raises(SystemExit) as stopped:
        main(["--bogus", "--out", "x"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "error: unrecognized arguments: --bogus (see --help)\n"
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "checked as train.py checks them" in text and "--out OUT" in text


def test_a_data_dir_that_cannot_be_made_names_the_key(tmp_path, capsys):
    """As train.py names it: the key, the value and the cause."""
    line = refused(capsys, "data=mnist", "paths.data_dir=/proc/x", "--out", str(tmp_path / "o"))
    assert line == "paths.data_dir=/proc/x cannot be used: No such file or directory (/proc/x)"
    assert not (tmp_path / "o").exists()


def test_the_example_of_help_runs(tmp_path, capsys):
    """The command ``--help`` shows writes its files."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    example = text.split("Example: python -m vfl_lightning.data.export ", 1)[1].split()
    assert example[-2:] == ["--out", "parties/"]
    assert main([*example[:-1], str(tmp_path / "parties")]) == 0, capsys.readouterr().err
    assert (tmp_path / "parties" / "manifest.json").is_file()
