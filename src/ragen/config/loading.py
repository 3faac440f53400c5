"""Reading a config: YAML files (within bounds, no key twice), presets and their ``extends:``
chains, dotted overrides (``algo.clip_high=0.28``), and writing the resolved config back out
as YAML that loads again.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ragen.config.build import build_schema, drop_removed
from ragen.config.checks import check_combinations
from ragen.config.errors import MESSAGE_CHARS, ConfigError, short, shown
from ragen.config.schema import Config, field_docs

PRESET_SUFFIX = ".yaml"
_MAX_EXTENDS_DEPTH = 8
_MAX_YAML_NODES = 100_000  # values of one YAML document with its aliases expanded
_MAX_YAML_DEPTH = 64  # nesting of one YAML document


def preset_dir() -> Path:
    """Folder of the YAML presets shipped with the package."""
    return Path(str(resources.files("ragen") / "configs"))


def preset_names() -> list[str]:
    """The presets shipped with the package, by name (the overlays they extend, in
    ``configs/overlays/``, are no presets of their own and are not listed)."""
    return sorted(p.stem for p in preset_dir().glob(f"*{PRESET_SUFFIX}"))


def preset_for_env(env_name: str) -> str | None:
    """The CPU preset of an env's family: the longest preset name the env name starts with
    (sokoban-large → sokoban, frozen-lake-8x8 → frozen-lake)."""
    family = [n for n in preset_names() if not n.endswith("-gpu") and env_name.startswith(n)]
    return max(family, key=len, default=None)


def file_exists(path: Path) -> bool:
    """Whether ``path`` is a file; False, not an error, for a name no file can have."""
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL
        return False


def _preset_path(name_or_path: str, folder: Path | None = None) -> Path:
    """The file a preset name or a path stands for; a relative path is read from ``folder``
    (the folder of the file that names it) when given, else from the current directory."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if folder is not None:
            path = folder / path
        if not file_exists(path):
            raise ConfigError(f"config: no such config file {shown(str(path))}")
        return path
    preset = preset_dir() / f"{name_or_path}{PRESET_SUFFIX}"
    if not file_exists(preset):
        raise ConfigError(
            f"config: unknown preset {shown(name_or_path)}: use one of "
            f"{', '.join(preset_names())} or a path to a .yaml file"
        )
    return preset


class _YamlTooLarge(yaml.YAMLError):
    """A document past _MAX_YAML_NODES or _MAX_YAML_DEPTH once its aliases are expanded (a
    "billion laughs"), or one that an alias makes contain itself."""


def _measure(node: yaml.Node, seen: dict[int, tuple[int, int]], open_: set[int]) -> tuple[int, int]:
    """(values, depth) of ``node`` with every alias expanded. A node that aliases share is
    measured once, so the walk stays as small as the text even when the expansion is not."""
    if id(node) in seen:
        return seen[id(node)]
    if id(node) in open_:
        raise _YamlTooLarge("an alias (*name) in it refers to a node that contains it")
    open_.add(id(node))
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    values, depth = 1, 1
    for child in children:
        child_values, child_depth = _measure(child, seen, open_)
        values, depth = values + child_values, max(depth, child_depth + 1)
    if values > _MAX_YAML_NODES:
        raise _YamlTooLarge(
            f"it holds more than {_MAX_YAML_NODES} values once its aliases (*name) are expanded"
        )
    if depth > _MAX_YAML_DEPTH:
        raise _YamlTooLarge(f"it nests deeper than {_MAX_YAML_DEPTH} levels")
    open_.discard(id(node))
    seen[id(node)] = values, depth
    return values, depth


class _BoundedLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a document that expands past the bounds: a few
    hundred bytes of nested aliases otherwise build a value whose every use (a copy, a
    repr, a type check) takes minutes and gigabytes. It also refuses a key written twice in
    one mapping, whose second value PyYAML would take without a word (a second
    ``overrides:`` in a study's scale dropped the first's settings)."""

    def construct_document(self, node: yaml.Node) -> Any:
        _measure(node, {}, set())
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[str] = set()
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue  # a merge (<<) may repeat keys: the mapping's own win, as YAML says
            if key.value in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key.value!r} appears twice in one mapping (line "
                    f"{key.start_mark.line + 1}): keep one",
                    key.start_mark,
                )
            seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> Any:
    """Parse YAML like yaml.safe_load, within bounds. Raises yaml.YAMLError, ValueError (an
    int Python will not read, beyond 4300 digits) or RecursionError (deep nesting)."""
    return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: builds plain data only


def read_yaml(path: Path) -> dict:
    """The mapping a YAML config file holds, parsed within bounds (see ``_BoundedLoader``):
    every reader of a config file goes through here. Raises ConfigError in one line."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"config: cannot read {path} ({err.strerror or err})") from None
    return yaml_mapping(raw, path)


def yaml_mapping(raw: bytes, path: Path) -> dict:
    """The mapping the bytes ``raw`` of config file ``path`` hold (see `read_yaml`)."""
    try:
        data = _load_yaml(raw.decode("utf-8"))
    except _YamlTooLarge as err:
        raise ConfigError(f"config: {path} is refused: {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config: {path} is not UTF-8 text (byte {err.start}): save it as UTF-8"
        ) from None
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            f"config: {path} is not valid YAML: {short(first, MESSAGE_CHARS)}"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of sections, got {type(data)}")
    return data


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        both_maps = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merge(out[key], value) if both_maps else value
    return out


def load_preset_data(name_or_path: str) -> dict:
    """A preset's data with its ``extends:`` chain merged in (the base first)."""
    chain: list[Path] = []
    path = _preset_path(name_or_path)
    data = read_yaml(path)
    layers = [data]
    while "extends" in layers[-1]:
        parent = layers[-1].pop("extends")
        if not isinstance(parent, str) or len(chain) >= _MAX_EXTENDS_DEPTH:
            raise ConfigError(
                f"config: extends={shown(parent)} must name a preset "
                f"(at most {_MAX_EXTENDS_DEPTH} deep)"
            )
        path = _preset_path(parent, path.parent)
        if path.resolve() in chain:
            raise ConfigError(f"config: extends={shown(parent)} forms a cycle")
        chain.append(path.resolve())
        layers.append(read_yaml(path))
    merged: dict = {}
    for layer in reversed(layers):
        merged = _merge(merged, layer)
    return merged


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"config: override {shown(text)} must look like section.key=value")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):
        value = raw  # not YAML (or too large): keep the literal text for the type check
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set dotted keys (``algo.clip_high=0.28``) into nested data; values are YAML scalars."""
    data = _merge({}, data)
    for text in overrides:
        path, value = _parse_override(text)
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part, {}), dict):
                raise ConfigError(f"config: override {shown(text)}: {part} is not a section")
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return data


def from_dict(data: dict) -> Config:
    """A Config from nested plain data, its values typed, in range and working together (the
    names it points to outside itself are judged by ragen.train.preflight.check_references)."""
    return check_combinations(build_schema(Config, data))


def load(name_or_path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Resolve a preset or YAML file plus dotted overrides into a Config checked as
    :func:`from_dict` checks one; None stands for no preset: the schema's own defaults."""
    data = load_preset_data(name_or_path) if name_or_path is not None else {}
    return from_dict(apply_overrides(data, list(overrides)))


def load_run(config_file: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The config a run directory's ``config_file`` (its config.yaml) records, with dotted
    overrides, checked as :func:`load` checks one. Keys ragen has removed since the run was
    started are dropped from the file rather than refused (``REMOVED_KEYS``); an override
    that sets one is refused as in any new config."""
    data = drop_removed(load_preset_data(str(config_file)))
    return from_dict(apply_overrides(data, list(overrides)))


# ------------------------------------------------------------------------------ serialising


def to_dict(c: Config) -> dict:
    return dataclasses.asdict(c)


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000)
    return text.removesuffix("\n").removesuffix("\n...")


def to_yaml(c: Config, *, doc: bool = False) -> str:
    """The resolved config as YAML, loadable again as a preset; ``doc`` adds field comments."""
    lines: list[str] = []
    for section in dataclasses.fields(c):
        obj = getattr(c, section.name)
        if doc:
            lines.append(f"# {field_docs(Config)[section.name]}")
        lines.append(f"{section.name}:")
        section_type: type = type(obj)
        docs = field_docs(section_type)
        for f in dataclasses.fields(obj):
            if doc:
                lines.append(f"  # {docs[f.name]}")
            lines.append(f"  {f.name}: {_scalar(getattr(obj, f.name))}")
    return "\n".join(lines) + "\n"
