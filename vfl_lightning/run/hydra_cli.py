"""What the root train.py adds around ``hydra.main``: Hydra's own errors (an option a group does not
have, a key the config does not have, an override the grammar cannot read, a config file YAML
cannot read) answered in one line ``error: ...`` with exit code 2, naming the key, the value and
the fix (the options, or the closest key), with ``HYDRA_FULL_ERROR=1`` keeping Hydra's own report
and traceback; and a ``--help`` that reads the config repository once, not once per group."""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from hydra.errors import (
    CompactHydraException,
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig
from omegaconf.errors import ConfigKeyError

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


class FailedJob(CompactHydraException):
    """A multirun job's one-line error (``code``: its exit code): Hydra goes on with the sweep and,
    at its end, reports the first failed job by this line alone."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.code = code


@contextmanager
def hydra_command_line() -> Iterator[None]:
    """Within: Hydra reports an error it raised (composing, parsing, launching) as one line and
    exits 2, unless ``HYDRA_FULL_ERROR=1`` (Hydra's own report then); ``--help`` lists the config
    groups from one copy of the config repository."""
    import hydra._internal.hydra as hydra_module
    import hydra._internal.utils as utils

    hydra_main = sys.modules["hydra.main"]  # the module (``hydra.main`` is also its decorator)
    from hydra.plugins.sweeper import Sweeper

    original = utils.run_and_report
    original_help = hydra_module.Hydra.app_help
    original_validate = Sweeper.validate_batch_is_legal
    original_parser = hydra_main.get_args_parser

    def get_args_parser():
        """Hydra's parser, a usage error one line (``--bogus``: before, its usage and the error)."""
        parser = original_parser()
        parser.error = lambda message: parser.exit(2, f"error: {message} (see --help)\n")
        return parser

    def app_help(self, *args, **kwargs):
        self.config_loader.get_group_options = group_options_from_one_repository(self.config_loader)
        try:
            return original_help(self, *args, **kwargs)
        finally:
            del self.config_loader.get_group_options

    def run_and_report(function):
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            return original(function)
        try:
            return function()
        except FailedJob as failed:
            print(str(failed), file=sys.stderr)
            sys.exit(failed.code)
        except Exception as error:
            line = explain(error)
            if line is None:  # not a configuration error: Hydra's report and traceback
                return original(lambda failure=error: _raise(failure))
            print(f"error: {line}", file=sys.stderr)
            sys.exit(2)

    def validate_batch_is_legal(self, batch):
        original_validate(self, batch)
        if type(self).__name__ == "BasicSweeper" and os.environ.get("HYDRA_FULL_ERROR") != "1":
            check_every_job(self, batch)

    utils.run_and_report = hydra_module.run_and_report = run_and_report
    hydra_module.Hydra.app_help = app_help
    Sweeper.validate_batch_is_legal = validate_batch_is_legal
    hydra_main.get_args_parser = get_args_parser
    try:
        yield
    finally:
        utils.run_and_report = hydra_module.run_and_report = original
        hydra_module.Hydra.app_help = original_help
        Sweeper.validate_batch_is_legal = original_validate
        hydra_main.get_args_parser = original_parser


def check_every_job(sweeper, batch) -> None:
    """A grid sweep (the basic sweeper) checks the keys and values of every job before the first
    starts (:func:`~vfl_lightning.run.early.check_early`, no imports): one bad value in a list
    (``data.batch_size=32,-1,64``) refuses the sweep in one line, exit 2, before anything
    trains. What only a job's own run finds (after the imports) fails that job, and the sweep
    goes on."""
    from vfl_lightning.run.job_checks import job_problem

    for number, overrides in enumerate(batch):
        problem = job_problem(sweeper, number, list(overrides))
        if problem is not None:
            raise FailedJob(
                f"error: {problem} (job {number} of the sweep: {' '.join(overrides)}; no job ran)",
                2,
            )


def group_options_from_one_repository(loader):
    """``loader.get_group_options`` answering the listings without overrides (what ``--help``
    asks, once per group) from one copy of the config repository; Hydra's own copies the whole
    repository, the structured configs of every plugin included, on every call."""
    from hydra.core.object_type import ObjectType

    original = loader.get_group_options
    repository = []

    def get_group_options(
        group_name, results_filter=ObjectType.CONFIG, config_name=None, overrides=None
    ):
        if config_name is not None or overrides:
            return original(group_name, results_filter, config_name, overrides)
        if not repository:
            repository.append(loader._parse_overrides_and_create_caching_repo(None, [])[1])
        return repository[0].get_group_options(group_name, results_filter)

    return get_group_options


def _raise(error: BaseException):
    raise error


def explain(error: BaseException) -> str | None:
    """The one line for a configuration error Hydra raised, or None for any other error."""
    marked = _in_chain(error, yaml.MarkedYAMLError)
    if marked is not None:
        return yaml_error(marked)
    if isinstance(error, MissingConfigException):
        return missing_option(error)
    if isinstance(error, OverrideParseException):
        return unreadable_override(error.override, error)
    if isinstance(error, ConfigCompositionException):
        return composition_error(error)
    if isinstance(error, OSError):
        return os_error(error)
    if isinstance(error, HydraException):
        return _one_line(error)
    return None


def _in_chain(error: BaseException | None, kind: type) -> BaseException | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    cause = error.__cause__
    if cause is not None and str(cause) and str(cause) not in str(error):
        text += " (" + " ".join(str(cause).split()) + ")"
    return text or type(error).__name__


def command_line_overrides() -> list[str]:
    return [argument for argument in sys.argv[1:] if not argument.startswith("-")]


def config_folders() -> list[Path]:
    """The file config sources of the running Hydra app (the search path, ``hydra.searchpath``
    included)."""
    from hydra.core.global_hydra import GlobalHydra

    hydra = GlobalHydra.instance()
    if not hydra.is_initialized():
        return []
    sources = hydra.config_loader().get_sources()
    return [Path(source.path) for source in sources if source.scheme() == "file"]


def _closest(word: str, candidates, prefix: str = "") -> str:
    found = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean {prefix}{found[0]}? " if found else ""


def missing_option(error: MissingConfigException) -> str:
    """``algo=foo``: the group's options, and the closest one."""
    group, _, option = str(error.missing_cfg_file).rpartition("/")
    options = error.options or group_files(group)  # a list (attack=[a,foo]) comes without them
    if not group or not options:
        return _one_line(error)
    where = re.match(r"In '([^']+)':", str(error))
    chooser = where.group(1) if where else None
    source = (
        f"{chooser} chooses " if chooser and "/" in chooser and chooser != "hydra/config" else ""
    )
    return (
        f"{source}{group}={option} is not an option of {group}: "
        f"{_closest(option, options, f'{group}=')}the options are {', '.join(options)}"
    )


def group_files(group: str) -> list[str]:
    """The options of config group ``group``: its YAML files in the app's config folders."""
    return sorted(
        {path.stem for folder in config_folders() for path in (folder / group).glob("*.yaml")}
    )


def unreadable_override(override: str, error: BaseException) -> str:
    """An override Hydra's grammar cannot read: a doubled ``=``, a character outside ASCII in a
    key or an unquoted value, unbalanced brackets."""
    key, equals, value = override.partition("=")
    key = key.lstrip("+~")
    if equals and value.startswith("="):
        return f"{override} has two '=': write {key}={value.lstrip('=')}"
    foreign = sorted({c for c in key if not c.isascii()})
    if foreign:
        return (
            f"{override}: the key {key} has {', '.join(map(repr, foreign))}, and keys are ASCII "
            f"names: {_closest(key, known_keys())}check the key's spelling"
        )
    if any(not c.isascii() for c in value) and value[:1] not in ("'", '"'):
        return (
            f"{override}: a value with characters outside ASCII must be quoted: write "
            f"{key}='{value}' (in a shell: \"{key}='{value}'\")"
        )
    unquoted = _outside_quotes(value)
    for opening, closing in ("[]", "{}", "()"):
        opened, closed = unquoted.count(opening), unquoted.count(closing)
        if opened != closed:
            example = f" (a list of lists: {key}=[[0,1],[2,3]])" if opening == "[" else ""
            return (
                f"{override} opens {opened} '{opening}' but closes {closed} '{closing}': close "
                f"every bracket{example}"
            )
    reason = str(error).split("\n")
    detail = next((line for line in reason if line and "override" not in line), reason[0])
    return (
        f"{override} cannot be read as an override ({' '.join(detail.split())}): write key=value, "
        f"and quote a value with spaces or special characters (see {GRAMMAR})"
    )


def _outside_quotes(text: str) -> str:
    return re.sub(r"'[^']*'|\"[^\"]*\"", "", text)


def known_keys() -> set[str]:
    """Every dotted key the config files set (for suggestions)."""
    from vfl_lightning.run.schema import shipped_defaults

    return set(shipped_defaults(tuple(config_folders()))) if config_folders() else set()


def composition_error(error: ConfigCompositionException) -> str:
    """A key the config does not have (``sed=3``, ``mechanism.bta=0.1``), one ``+`` adds twice,
    ``~`` removes what is not there."""
    text = str(error)
    missing = _in_chain(error.__cause__, ConfigKeyError) or _in_chain(
        error.__cause__, AttributeError
    )
    override = re.search(r"To append to your config use \+(\S+)", text)
    if missing is not None and override is not None:
        return unknown_key(override.group(1), missing)
    added = re.search(r"An item is already at '([^']+)'", text)
    if added is not None:
        value = re.search(r"remove \+ prefix: '([^']+)'", text)
        fix = value.group(1) if value else f"{added.group(1)}=..."
        return (
            f"+{fix} adds {added.group(1)}, which the config already has: write {fix} "
            f"(or ++{fix} to add or override)"
        )
    removed = re.search(r"Could not delete from config\. '([^']+)' does not exist", text)
    if removed is not None:
        key = removed.group(1)
        return (
            f"~{key} removes {key}, which the config does not have: "
            f"{_closest(key, known_keys(), '~')}check the key's spelling"
        )
    return _one_line(error)


def unknown_key(override: str, missing: BaseException) -> str:
    """``override`` sets a key its node does not have: the node's keys, the closest one, and the
    options of the group that have the key."""
    full_key = str(getattr(missing, "full_key", "") or override.partition("=")[0])
    value = override.partition("=")[2]
    parent_path, _, name = full_key.rpartition(".")
    parent = getattr(missing, "parent_node", None)
    keys = [str(k) for k in parent] if isinstance(parent, DictConfig) else []
    where = parent_path or "the root config"
    target = parent.get("_target_") if isinstance(parent, DictConfig) else None
    group = parent_path.split(".")[0] if parent_path else ""
    chosen, having = group_options(group, name, target) if group else (None, [])
    if chosen:
        where = f"{group}={chosen}"
    listed = ", ".join(sorted(k for k in keys if not k.startswith("_")))
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.6)
    if close:
        fix = f"did you mean {'.'.join(filter(None, [parent_path, close[0]]))}={value}?"
    elif having:
        fix = f"{', '.join(f'{group}={h}' for h in having)} has it: choose it, or drop the override"
    else:
        fix = f"check the spelling of {name!r}, or drop the override"
    return f"{full_key} is not a config key ({where} takes {listed}): {fix}"


def group_options(group: str, key: str, target) -> tuple[str | None, list[str]]:
    """(the option of ``group`` whose ``_target_`` is ``target``, the options that set ``key``),
    read from the config files."""
    chosen, having = None, []
    for folder in config_folders():
        for file in sorted((folder / group).glob("*.yaml")) if (folder / group).is_dir() else []:
            text = file.read_text()
            if "@package _global_" in text:
                continue
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if not isinstance(data, dict):
                continue
            if target is not None and data.get("_target_") == target and chosen is None:
                chosen = file.stem
            if key in data:
                having.append(file.stem)
    return chosen, having


def yaml_error(error: yaml.MarkedYAMLError) -> str:
    """A config file YAML cannot read: the file, the place, what is wrong there, and which
    option chose the file."""
    mark = error.problem_mark or error.context_mark
    problem = " ".join(str(error.problem or error.context or "").split())
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a config"
    chosen = ""
    if mark is not None:
        for override in command_line_overrides():
            group, _, option = override.lstrip("+").partition("=")
            if option and mark.name.endswith(f"{group}/{option}.yaml"):
                chosen = f" (chosen by {group}={option})"
    fix = (
        "indent with spaces: YAML does not allow a tab there"
        if "\\t" in problem or "\t" in problem
        else "fix the YAML there"
    )
    return f"{where}{chosen}: {problem}: {fix}"


def os_error(error: OSError) -> str:
    """A file Hydra could not read while composing: the override that led to it."""
    name = str(error.filename or "")
    reason = error.strerror or str(error)
    for override in command_line_overrides():
        key = override.partition("=")[0].lstrip("+~")
        if key and key.replace(".", "/") in name:
            shown = key if len(key) <= 60 else f"{key[:40]}... ({len(key)} characters)"
            return (
                f"{shown} is not a config key (looking it up failed: {reason}): check the "
                "override's key (a dotted name such as data.batch_size)"
            )
    return f"{reason}: {name}" if name else _one_line(error)
