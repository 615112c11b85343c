"""Compose a configuration: schema defaults <- YAML preset <- dotted command-line overrides.

Overrides are written exactly as in the user's documents (``psrl.staleness=2``). Every key is
checked against the schema; unknown keys are refused with a did-you-mean suggestion, and all
problems (unknown keys, bad types, broken cross-field rules) are reported together.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from psrl.config import keys
from psrl.config.data import reward_file
from psrl.config.root import Config
from psrl.config.rules import check
from psrl.errors import ConfigError, ConfigProblem

PRESET_ENV = "PSRL_CONFIG_DIR"
Tree = dict[str, Any]


def preset_dirs() -> list[Path]:
    """Where preset names are looked up: $PSRL_CONFIG_DIR, then the shipped presets (psrl/presets in an
    installed wheel, the repository's configs/ in a checkout)."""
    dirs = [Path(p) for p in os.environ.get(PRESET_ENV, "").split(os.pathsep) if p]
    package = Path(__file__).resolve().parents[1]
    dirs += [d for d in (package / "presets", package.parent / "configs") if d.is_dir()]
    return dirs


def available_presets() -> list[str]:
    return sorted({p.stem for d in preset_dirs() if d.is_dir() for p in d.glob("*.yaml")})


def find_preset(name: str) -> Path:
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    for directory in preset_dirs():
        path = directory / f"{name}.yaml"
        if path.is_file():
            return path
    known = ", ".join(available_presets()) or "none"
    raise ConfigError(
        [
            ConfigProblem(
                ("preset",),
                repr(name),
                "no such preset or YAML file",
                f"use one of: {known}, or a path to a .yaml file",
            )
        ]
    )


def load_preset_tree(name: str) -> Tree:
    """Read a preset; a preset may start from another with `extends: <name>`. Relative file paths in it
    (model, data files, a reward file) are relative to the preset file, so a config can name files next to it."""
    path = find_preset(name)
    tree = yaml.safe_load(path.read_text()) or {}
    if not isinstance(tree, dict):
        raise ConfigError([ConfigProblem(("preset",), str(path), "a preset must be a YAML mapping", "fix the file")])
    parent = tree.pop("extends", None)
    relative_to_file(tree, path.parent)
    return merge(load_preset_tree(parent), tree) if parent else tree


# (section, key) of fields holding file paths; the reward function's file part (before ':') counts too
PATH_FIELDS = (("model", "path"), ("model", "tokenizer_path"), ("data", "train_files"), ("data", "val_files"),
               ("reward", "function"), ("agent", "entry"), ("agent", "dataset"))  # fmt: skip


def relative_to_file(tree: Tree, base: Path) -> None:
    """Rewrite relative paths of PATH_FIELDS in a config tree as absolute paths under `base`."""
    for section_name, key in PATH_FIELDS:
        section = tree.get(section_name)
        if not isinstance(section, dict) or section.get(key) in (None, ""):  # unset (an agent's entry or dataset)
            continue
        value = section[key]
        if key in ("function", "entry"):
            file = reward_file(str(value))
            section[key] = f"{_under(base, file[0])}:{file[1]}" if file else value
        elif isinstance(value, list):
            section[key] = [_under(base, str(v)) for v in value]
        else:
            section[key] = _under(base, str(value))


def _under(base: Path, path: str) -> str:
    expanded = Path(path).expanduser()
    return str(expanded if expanded.is_absolute() else (base / expanded).resolve())


def merge(base: Tree, update: Tree) -> Tree:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b.c=value`` -> (``a.b.c``, parsed value); values are YAML scalars/lists."""
    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise ConfigError(
            [ConfigProblem((text,), repr(text), "an override is written key=value", "write it like psrl.staleness=2")]
        )
    raw = raw.strip()
    value = None if raw in ("None", "null", "~", "") else yaml.safe_load(raw)
    return path.strip(), value


def schema_paths(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, bool]:
    """Every dotted path of the schema -> whether it is a section (True) or a leaf (False)."""
    out: dict[str, bool] = {}
    for name, info in model.model_fields.items():
        path = prefix + name
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out[path] = True
            out.update(schema_paths(sub, path + "."))
        else:
            out[path] = False
    return out


def free_form_maps(model: type[BaseModel] = Config, prefix: str = "") -> set[str]:
    """Dotted paths of mapping fields whose keys the schema leaves open (e.g. engine.vllm_args)."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out |= free_form_maps(sub, prefix + name + ".")
        elif get_origin(sub) is dict:
            out.add(prefix + name)
    return out


# A suggestion's key name must be this close to the typed one (difflib's ratio), and its section this
# close to the typed section. The whole path's ratio was not enough: a long shared section prefix
# made any key of the section "close" (trainer.foo proposed trainer.seed).
NAME_CUTOFF = 0.75
SECTION_CUTOFF = 0.7


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def close_keys(path: str, paths: Iterable[str], limit: int = 3) -> list[str]:
    """Schema paths that are plausible typos of ``path``: a close key name in a close section, else the
    same key name in another section (a key written under the wrong section); best first."""
    section, _, name = path.rpartition(".")
    scored = []
    candidates = list(paths)
    for candidate in candidates:
        other_section, _, other_name = candidate.rpartition(".")
        name_ratio, section_ratio = _ratio(name, other_name), _ratio(section, other_section)
        if name_ratio >= NAME_CUTOFF and section_ratio >= SECTION_CUTOFF:
            scored.append((name_ratio + section_ratio, candidate))
    best = max((score for score, _ in scored), default=0.0)
    # only the near-best: one clear match is not followed by the merely plausible
    close = [candidate for score, candidate in sorted(scored, key=lambda item: -item[0]) if score >= best - 0.1]
    return close[:limit] or [p for p in candidates if p.rpartition(".")[2] == name][:limit]


def suggest(path: str, paths: Iterable[str]) -> str:
    close = close_keys(path, paths)
    return f"did you mean {' or '.join(close)}?" if close else "see `psrl config docs` for every field"


def check_key(path: str, value: Any, known: dict[str, bool]) -> ConfigProblem | None:
    """None when ``path`` is a schema path; otherwise the problem explaining why not."""
    if path in known:
        return None
    shown = repr(value)
    new = keys.moved_to(path)
    if new is not None:
        return ConfigProblem((path,), shown, "this key has moved", f"write it as {new}")
    reason = keys.not_applicable(path)
    if reason is not None:
        return ConfigProblem((path,), shown, f"not applicable in psrl: {reason}", "remove it")
    leaves = (p for p, is_section in known.items() if not is_section)
    return ConfigProblem((path,), shown, "unknown configuration key", suggest(path, leaves))


def flatten(tree: Tree, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from flatten(value, path + ".")
        else:
            yield path, value


def set_path(tree: Tree, path: str, value: Any) -> None:
    node = tree
    *parents, leaf = path.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


def build_tree(
    preset: str | None, overrides: Iterable[str], base: Tree | None = None
) -> tuple[Tree, list[ConfigProblem]]:
    """Merge base tree, preset and overrides into one tree of known keys; collect key problems."""
    known = schema_paths()
    maps = tuple(path + "." for path in free_form_maps())
    problems: list[ConfigProblem] = []
    tree: Tree = {}
    items = list(flatten(base)) if base else []
    items += list(flatten(load_preset_tree(preset))) if preset else []
    for text in overrides:
        items.append(parse_override(text))
    for raw_path, value in items:
        path = keys.apply_alias(raw_path)
        if path.startswith(maps):  # a key inside a free-form map: its owner validates it
            set_path(tree, path, value)
            continue
        bad = check_key(path, value, known)
        if bad is not None:
            problems.append(bad)
        elif known[path] and value not in (None, {}):
            problems.append(
                ConfigProblem(
                    (path,),
                    repr(value),
                    "this is a section, not a value",
                    f"set one of its fields, e.g. {path}.<field>=...",
                )
            )
        elif not known[path]:
            set_path(tree, path, value)
    return tree, problems


def load_config(preset: str | None = None, overrides: Iterable[str] = (), *, base: Config | None = None) -> Config:
    """Build and validate a configuration, raising ConfigError listing every problem.

    `base`: a configuration to start from instead of the schema defaults (the preset and overrides apply on top)."""
    tree, problems = build_tree(preset, overrides, base.model_dump(mode="json") if base is not None else None)
    try:
        config = Config.model_validate(tree)
    except ValidationError as exc:
        problems += _validation_problems(exc)
        # Check the cross-field rules too, with the invalid values left at their defaults,
        # so one run reports everything.
        for err in exc.errors():
            drop_path(tree, [str(p) for p in err["loc"]])
        try:
            config = Config.model_validate(tree)
        except ValidationError:
            raise ConfigError(problems) from None
    problems += check(config)
    if problems:
        raise ConfigError(problems)
    return config


def drop_path(tree: Tree, parts: list[str]) -> None:
    node: Any = tree
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(parts[-1], None)


_FIXES = {
    "int_parsing": "give an integer",
    "int_from_float": "give an integer",
    "float_parsing": "give a number",
    "bool_parsing": "give True or False",
    "string_type": "give a string",
    "greater_than_equal": "use a value >= {ge}",
    "greater_than": "use a value > {gt}",
    "less_than_equal": "use a value <= {le}",
    "less_than": "use a value < {lt}",
    "literal_error": "use one of {expected}",
}


def _validation_problems(exc: ValidationError) -> list[ConfigProblem]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        template = _FIXES.get(err["type"], "see `psrl config docs` for the field's type")
        fix = template.format(**err.get("ctx", {}))
        # a field validator states its own fix after "; fix: "
        message, _, own_fix = err["msg"].removeprefix("Value error, ").partition("; fix: ")
        out.append(ConfigProblem((path,), repr(err.get("input")), message, own_fix or fix))
    return out


def to_yaml(config: Config) -> str:
    """The fully resolved configuration as YAML (loadable again as a preset)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, default_flow_style=False)


def from_yaml_file(path: str | Path) -> Config:
    """Load a resolved config (e.g. a run directory's config.yaml) with full validation."""
    return load_config(str(path))


def split_preset(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Command-line arguments as (preset, overrides): the first is a preset when it is not a key=value override."""
    if args and "=" not in args[0]:
        return args[0], list(args[1:])
    return None, list(args)
