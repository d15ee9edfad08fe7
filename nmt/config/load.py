"""Loading a config: YAML, `--set` overrides, and strict typed conversion.

`load_config` rejects unknown keys (with a "did you mean" suggestion), checks
types and enums, and names the file (or `--set` item) and dotted key path of
anything wrong. YAML is read by `_StrictLoader`: a duplicate key is an error,
not a silently dropped value, and aliases (`*name`) are refused, so a few bytes
cannot expand into millions of values. Quoted values are capped by `shorten`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from nmt.config.ranges import range_of
from nmt.config.schema import ExperimentConfig
from nmt.errors import ConfigError, shorten
from nmt.metrics import bleu_tokenizer, tokenizer_problem


class _Refused(Exception):
    """YAML that parses but that we refuse: `line` (1-based) and what is wrong."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line, self.problem = line, problem


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses duplicate mapping keys and aliases.

    Aliases are refused rather than bounded: no shipped config uses them, a
    config of a few dozen keys never needs them, and refusing means nothing
    downstream (overrides, type checks, error messages) ever walks a shared
    subtree that expands exponentially ("billion laughs").
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(event.start_mark.line + 1,
                           f"YAML alias {shorten('*' + str(event.anchor), 60)} is not supported "
                           "(aliases can expand without bound); write the value out in full")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeConstructor reports it
                continue
            if seen is not key_node:
                raise _Refused(key_node.start_mark.line + 1, f"duplicate key {shorten(repr(key), 80)} "
                               f"(first at line {seen.start_mark.line + 1}); remove one")
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            return super().construct_yaml_int(node)
        except ValueError:  # Python refuses to parse integers of over 4300 digits
            raise _Refused(node.start_mark.line + 1, f"an integer of {len(node.value)} digits is too large") from None


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def load_config(path: str | Path, overrides: typing.Sequence[str] = (), *, training: bool = False) -> ExperimentConfig:
    """Read a YAML file, apply `section.key=value` overrides, and validate (`training`: as a config to train).

    Raises:
        ConfigError: missing file, YAML syntax error, unknown key, wrong type or
            value, or (`training`) what keeps it from training (`ExperimentConfig.training_problem`);
            the message names the file (or the `--set` item) and the dotted key path.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a config file; give the YAML file itself")
    if not path.exists():  # a pipe is read (`nmt train <(sed ... base.yaml)`), /dev/null as the empty file it reads
        resolved = "" if path.is_absolute() else f" (resolved to {path.resolve()})"
        raise ConfigError(f"{path}: config file not found{resolved}")
    try:
        data = path.read_bytes()
    except OSError as err:  # the CLI leaves the check to here, for one line rather than click's usage error
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror})") from None
    try:
        raw = _parse_yaml(data.decode("utf-8"))
    except _Refused as err:
        raise ConfigError(f"{path}: line {err.line}: {err.problem}") from None
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(f"{path}: line {line}: not UTF-8 text ({err.reason}); save the file as UTF-8") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        cfg = _validated(raw, overrides, path, training=training)
    except ConfigError as err:
        raise _blame_overrides(err, raw, overrides, path, training=training) from None
    return cfg


def _validated(raw: dict[str, Any], overrides: typing.Sequence[str], path: Path, *, training: bool) -> ExperimentConfig:
    """The config of the file's `raw` mapping with `overrides` applied, checked as `load_config` says."""
    cfg = config_from_dict(apply_overrides(raw, overrides), source=str(path), in_yaml=True)
    problem = tokenizer_problem(cfg.eval.tokenize)  # here, not at the first validation of a training run
    if problem:
        why = f" (sacreBLEU's for data.tgt_lang {cfg.data.tgt_lang!r})" if bleu_tokenizer(
            "auto", cfg.data.tgt_lang) == cfg.eval.tokenize else ""
        raise ConfigError(f"{path}: eval.tokenize {cfg.eval.tokenize!r}{why}: {problem}")
    problem = cfg.training_problem() if training else None
    if problem:
        raise ConfigError(f"{path}: {problem}")
    return cfg


def _blame_overrides(err: ConfigError, raw: dict[str, Any], overrides: typing.Sequence[str], path: Path, *,
                     training: bool) -> ConfigError:
    """`err`, a rule across keys broken (no one item's own check sees it), naming the `--set` items that break it
    where the file alone keeps it: those that break it alone, else all of them."""
    prefix = f"{path}: "
    if not overrides or not str(err).startswith(prefix):
        return err

    def breaks(items: typing.Sequence[str]) -> bool:
        try:
            _validated(raw, items, path, training=training)
        except ConfigError:
            return True
        return False

    if breaks([]):  # the file's own problem
        return err
    items = [item for item in overrides if breaks([item])] or list(overrides)
    return ConfigError(f"{' '.join(_set_item(item) for item in items)} (on {path}): {str(err)[len(prefix):]}")


def _parse_yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: builds plain data only
    except RecursionError:  # PyYAML composes nested collections by recursion
        raise yaml.YAMLError("lists or mappings nested too deeply to parse; a config nests a few levels") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """`line L, column C: YAML syntax error: PROBLEM (CONTEXT that starts at line L', column C')`."""
    mark = getattr(err, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and start is not None and mark is not None and (start.line, start.column) != (mark.line, mark.column):
        problem += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
    if "\\t" in problem or "\t" in problem:
        problem += "; indent with spaces, not tabs"
    return f"{where}YAML syntax error: {shorten(problem, 300)}"


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """Return a copy of `raw` with each `a.b.c=value` set (value parsed as YAML).

    Raises:
        ConfigError: an item without `=`, a key that no config section has, or a
            value of the wrong type; the message names the `--set` item.
    """
    raw = copy.deepcopy(raw)
    for item in overrides:
        where = _set_item(item)
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{where}: expected section.key=value")
        parts = key.strip().split(".")
        if _text_key(parts, text.strip()) and text.strip()[0] not in "\"'":
            value: Any = text.strip()  # as typed: YAML would read `no` as false, `12:30` as 750, `#x` as nothing
        else:
            try:
                value = _parse_yaml(text) if text.strip() else None
            except _Refused as err:
                raise ConfigError(f"{where}: {err.problem}") from None
            except yaml.YAMLError:
                value = text
        _refuse_into_list(raw, [p.split("[")[0] for p in parts], where)
        _check_override(item, parts, value, _lookup(raw, parts))
        node = raw
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{where}: {shorten('.'.join(parts[: i + 1]))} is not a section")
            node = child
        _put(node, parts, value)
    return raw


def _refuse_into_list(raw: dict[str, Any], parts: list[str], where: str) -> None:
    """Refuse a key that goes on below a list of sections (`data.train.weight`, `data.train.0.weight` and
    `data.train[0].weight` where `data.train` is a list): --set sets whole values there."""
    node: Any = raw
    for i, part in enumerate(parts[:-1]):
        node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, list):
            key = shorten(".".join(parts[: i + 1]))
            raise ConfigError(f"{where}: {key} is a list of {len(node)} sections here, which --set cannot reach "
                              f"into; set the whole list, e.g. --set '{key}=[{{path: a}}, {{path: b, weight: 2}}]'")


def _put(node: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set `node[parts[-1]]` to `value`; a mapping given for a section that `node` holds is merged into it, key by
    key (`--set 'model.transformer={dropout: 0.2}'` keeps the file's d_model), as if each key were set alone."""
    old = node.get(parts[-1])
    if isinstance(value, dict) and isinstance(old, dict) and _names_section(parts):
        for key, item in value.items():
            _put(old, [*parts, str(key)], item)
    else:
        node[parts[-1]] = value


def _names_section(parts: list[str]) -> bool:
    """Whether the key `parts` names a config section (`model.transformer`, `data.train`), not a value, nor a
    mapping of named sections such as `data.test`, which a mapping replaces."""
    try:
        tp = _key_field(parts, "")[1]
    except ConfigError:
        return False
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return any(dataclasses.is_dataclass(m) for m in members)


def _text_key(parts: list[str], text: str) -> bool:
    """Whether the `--set` value `text` for the key `parts` is taken as typed: the key holds text (`run_dir`,
    `data.src_lang`, `data.hf_config`), or a path that may be a list (`data.train.path`) and `text` is no
    `[...]` list; an optional key's `null` or `~` and an empty value are read as YAML (None). False for any
    other key, or none (which `_check_override` then names)."""
    try:
        tp = _key_field(parts, "")[1]
    except ConfigError:
        return False
    members = set(typing.get_args(tp)) if typing.get_origin(tp) in (typing.Union, types.UnionType) else {tp}
    if not text or (type(None) in members and text in ("null", "Null", "NULL", "~")):
        return False
    members.discard(type(None))
    return members == {str} or (members == {str, list[str]} and not text.startswith("["))


def _lookup(raw: dict[str, Any], parts: list[str]) -> Any:
    """The value at the key `parts` of `raw`, or None where it has none."""
    node: Any = raw
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _check_override(item: str, parts: list[str], value: Any, existing: Any = None) -> None:
    """Check one override against the schema, so a mistake names the `--set` item, not the file. A mapping
    for a section the file has (`existing`) is merged into it key by key (`_put`), so each of its keys is
    checked as if set alone: checked whole, against the section's defaults, `{d_model: 30}` was refused for
    the defaults' 8 heads where the file has 2. Checks across keys are the whole config's, once merged."""
    if isinstance(value, dict) and isinstance(existing, dict) and _names_section(parts):
        for key, item_value in value.items():
            _check_override(item, [*parts, str(key)], item_value, existing.get(key))
        return
    where = _set_item(item)
    field, tp = _key_field(parts, where)
    if value is None and dataclasses.is_dataclass(tp):  # building it would take every default of the section
        raise ConfigError(f"{where}: {'.'.join(parts)}: expected a mapping, got nothing (null); set its keys, e.g. "
                          f"--set '{'.'.join(parts)}={{key: value}}'")
    if value is None and tp is str:  # `--set train.init_from=` meant to clear a path the file gives
        raise ConfigError(f"{where}: {'.'.join(parts)}: expected text, got nothing; to empty it, give two quotes: "
                          f"--set \"{'.'.join(parts)}=''\"")
    _check_range(field, _convert(tp, value, ".".join(parts), where, in_yaml=False), ".".join(parts), where)


def _key_field(parts: list[str], where: str) -> tuple[dataclasses.Field, Any]:
    """The schema's field that the key `parts` names, and its type (a union's first member where a section
    goes on below it).

    Raises:
        ConfigError: a key no section has, or a value read as a section; the message begins with `where`.
    """
    tp: Any = ExperimentConfig
    for i, part in enumerate(parts):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType) and inner:
            tp = inner[0]
        if typing.get_origin(tp) is dict:  # data.test.NAME: any name
            tp = typing.get_args(tp)[1]
            continue
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"{where}: {shorten('.'.join(parts[:i]))} is a value, not a section")
        fields = {f.name: f for f in dataclasses.fields(tp)}
        if part not in fields:
            hint = _suggest(part, list(fields), ".".join(parts[:i]), in_yaml=False)  # a --set key
            raise ConfigError(f"{where}: unknown key {shorten(repr('.'.join(parts[: i + 1])))}{hint}")
        field, tp = fields[part], typing.get_type_hints(tp)[part]
    return field, tp


def _set_item(item: str) -> str:
    return f"--set {shorten(repr(item), 100)}"


MAX_LISTED_KEYS = 15
"""The most keys an unknown key's message lists; a larger section is left to `nmt config-reference`."""


def _suggest(key: Any, names: list[str], keypath: str, *, in_yaml: bool) -> str:
    """The hint after "unknown key": the key where another section has it (a YAML indentation slip puts `valid`
    at the top level or `kind` in `data`, which `in_yaml` names as the likely cause; a `--set` key has no
    indentation), else the close names of this section, else all of them."""
    elsewhere = [path for path in _schema_paths(ExperimentConfig) if path.rsplit(".", 1)[-1] == str(key)
                 and path.rpartition(".")[0] != keypath]
    if elsewhere:
        places = " or ".join(repr(p) for p in elsewhere[:3])
        return f"; did you mean {places}, a key of another section?{' (in YAML, check its indentation)' if in_yaml else ''}"
    close = difflib.get_close_matches(str(key), names, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    if len(names) > MAX_LISTED_KEYS:  # train's 41 would make a line of 600 characters
        return f"; `nmt config-reference` lists the {len(names)} keys of {keypath or 'the top level'!r}"
    return f"; known keys: {', '.join(names)}"


def _schema_paths(tp: Any, prefix: str = "") -> list[str]:
    """Every key path of the schema below `tp`, sections first-level first; a named test set is `NAME`."""
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and inner:
        return _schema_paths(inner[0], prefix)
    if typing.get_origin(tp) is dict:
        return _schema_paths(typing.get_args(tp)[1], join_key(prefix, "NAME"))
    if not dataclasses.is_dataclass(tp):
        return []
    hints = typing.get_type_hints(tp)
    paths = []
    for f in dataclasses.fields(tp):
        paths += [join_key(prefix, f.name), *_schema_paths(hints[f.name], join_key(prefix, f.name))]
    return paths


def config_from_dict(raw: dict[str, Any], source: str = "<config>", *, in_yaml: bool = False) -> ExperimentConfig:
    """Build a validated `ExperimentConfig` from plain data (YAML or a checkpoint); `in_yaml`: `raw` was read from
    the YAML file `source`, whose indentation an unknown key's hint may blame."""
    cfg = _build(ExperimentConfig, raw, "", source, in_yaml=in_yaml)
    cfg.written = frozenset(_key_paths(raw))
    return cfg


def _key_paths(raw: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted paths of the values in `raw`, a section's own key for each mapping it holds too."""
    paths = []
    for key, value in raw.items():
        path = f"{prefix}{key}"
        paths.append(path)
        if isinstance(value, dict):
            paths += _key_paths(value, f"{path}.")
    return paths


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain data (lists for tuples) suitable for YAML, JSON and checkpoints."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the resolved config as YAML."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False), encoding="utf-8")


def _build(cls: type, raw: Any, keypath: str, source: str, *, in_yaml: bool) -> Any:
    where = f"{source}: {keypath or 'top level'}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {_describe(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            hint = _suggest(key, list(fields), keypath, in_yaml=in_yaml)
            raise ConfigError(f"{source}: unknown key {shorten(repr(join_key(keypath, key)))}{hint}")
        kwargs[key] = _convert(hints[key], value, join_key(keypath, key), source, in_yaml=in_yaml)
        _check_range(fields[key], kwargs[key], join_key(keypath, key), source)
    try:
        return cls(**kwargs)
    except ValueError as err:
        msg = shorten(str(err), 300)  # the schema's messages quote values
        # Messages name their field first ("d_model (100) must ..."): prefix the section path.
        raise ConfigError(f"{source}: {keypath + ': ' if keypath else ''}{msg}") from None


def _check_range(field: dataclasses.Field, value: Any, keypath: str, where: str) -> None:
    """Refuse a number outside the field's schema `Range` (NaN and infinity included)."""
    rng = range_of(field)
    problem = rng.problem(value) if rng else None
    if problem:
        raise ConfigError(f"{where}: {keypath}: {shorten(problem, 300)}")


def _convert(tp: Any, value: Any, keypath: str, source: str, *, in_yaml: bool) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        member = _member_for(inner, value)
        if member is None:  # the first member's complaint ("expected a list") would hide that text also does
            kinds = " or ".join(dict.fromkeys(map(_kind, inner)))
            raise ConfigError(f"{source}: {keypath}: expected {kinds}, got {_describe(value)}")
        return _convert(member, value, keypath, source, in_yaml=in_yaml)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, keypath, source, in_yaml=in_yaml)
    if origin is Literal:
        if not any(type(a) is type(value) and a == value for a in args):  # 1 is not true, nor 0 false
            close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            choices = ", ".join(str(a).lower() if isinstance(a, bool) else repr(a) for a in args)  # YAML's true
            raise ConfigError(f"{source}: {keypath}: {shorten(repr(value))} is not one of {choices}{hint}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {keypath}: expected a mapping, got {_describe(value)}")
        return {str(k): _convert(args[1], v, f"{keypath}.{shorten(str(k), 80)}", source, in_yaml=in_yaml)
                for k, v in value.items()}
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {keypath}: expected a list, got {_describe(value)}")
        return [_convert(args[0], v, f"{keypath}[{i}]", source, in_yaml=in_yaml) for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{source}: {keypath}: expected a list of {len(args)} numbers, got {_describe(value)}")
        return tuple(_convert(a, v, f"{keypath}[{i}]", source, in_yaml=in_yaml)
                     for i, (a, v) in enumerate(zip(args, value)))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # beyond any float: as infinity, which a range refuses
            raise ConfigError(f"{source}: {keypath}: {shorten(str(value))} is not a finite number") from None
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-4" as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and (type(value) is not tp):
        hint = ("; YAML reads an unquoted yes, no, on, off, true or false as a boolean: put the text in quotes"
                if tp is str and isinstance(value, bool) else "")
        raise ConfigError(f"{source}: {keypath}: expected {tp.__name__}, got {_describe(value)}{hint}")
    if tp is str and "\0" in value:  # no path, language code or name holds one; the OS refuses it in a path
        raise ConfigError(f"{source}: {keypath}: {shorten(repr(value))} holds a NUL character (\\0); remove it")
    return value


def _member_for(types_: list[Any], value: Any) -> Any:
    """The member of a union that `value` is written as: a list for a list type, a mapping for a
    section, an int for int (not bool), a number for float; None where it is none of them."""
    def fits(tp: Any) -> bool:
        origin = typing.get_origin(tp)
        if origin is list:
            return isinstance(value, list)
        if dataclasses.is_dataclass(tp) or origin is dict:
            return isinstance(value, dict)
        if tp is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if tp is float:
            return isinstance(value, (int, float, str)) and not isinstance(value, bool)  # as _convert reads them
        return isinstance(tp, type) and isinstance(value, tp)

    return next((tp for tp in types_ if fits(tp)), None)


def _kind(tp: Any) -> str:
    """How an error names what a type is written as: "a list", "a mapping", "str"."""
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        return "a list"
    if dataclasses.is_dataclass(tp) or origin is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {shorten(repr(value))}" if value is not None else "nothing (null)"


def join_key(keypath: str, key: Any) -> str:
    return f"{keypath}.{key}" if keypath else str(key)


