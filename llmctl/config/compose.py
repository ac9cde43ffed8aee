"""Compose a run configuration from a recipe, Hydra overrides and short flags.

A recipe is a YAML file whose `defaults:` list chooses config-group options (deltas only);
groups it does not choose take `DEFAULT_CHOICES`. The recipe is registered in Hydra's ConfigStore
with the full defaults list and composed through Hydra's compose API (never `@hydra.main`), so
trailing `key=value` arguments use Hydra's override grammar. The result is merged onto the
dataclass schema (type checks), converted to dataclasses and validated.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from llmctl.config.schema import DEFAULT_CHOICES, GROUPS, RootConfig
from llmctl.config.validate import validate
from llmctl.errors import UserError
from llmctl.resources import list_options, list_recipes, resource_dir

SHORT_FLAGS: dict[str, str] = {
    "tp": "parallel.tp",
    "pp": "parallel.pp",
    "vpp": "parallel.vpp",
    "cp": "parallel.cp",
    "ep": "parallel.ep",
    "dp": "parallel.dp",
    "mbs": "parallel.micro_batch_size",
    "gbs": "train.global_batch_size",
    "nodes": "cluster.num_nodes",
    "gpus_per_node": "cluster.gpus_per_node",
}

_RECIPE_NODE = "__llmctl_recipe__"
_CLUSTER_FILE_NODE = "__llmctl_cluster_file__"
_SCHEMA_NODE = "__llmctl_schema__"
#: Cluster keys renamed in 0.2 (they hold GB/s, not Gb/s); old names still load.
CLUSTER_KEY_ALIASES = {
    "hbm_bandwidth_gbps": "hbm_bandwidth_gb_s",
    "nvlink_bandwidth_gbps": "nvlink_bandwidth_gb_s",
    "internode_bandwidth_gbps": "internode_bandwidth_gb_s",
}


def cluster_aliases(body: dict[str, Any]) -> dict[str, Any]:
    """A cluster mapping with old key names replaced by their new names."""
    return {CLUSTER_KEY_ALIASES.get(k, k): v for k, v in body.items()}


def flag_overrides(**flags: int | None) -> list[str]:
    """Turn short flags (`tp=8`, `gbs=128`) into Hydra overrides; None flags are dropped."""
    out = []
    for name, value in flags.items():
        if value is None:
            continue
        if name not in SHORT_FLAGS:
            raise UserError(f"unknown short flag --{name.replace('_', '-')}")
        out.append(f"{SHORT_FLAGS[name]}={value}")
    return out


def resolve_recipe(recipe: str) -> Path:
    """Find a recipe by name (shipped) or by path to a YAML file."""
    path = Path(recipe)
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        if not path.is_file():
            raise UserError(f"recipe file {recipe} does not exist")
        return path.resolve()
    shipped = resource_dir("recipes") / f"{recipe}.yaml"
    if shipped.is_file():
        return shipped
    raise UserError(f"unknown recipe {recipe!r}{_closest(recipe, list_recipes())}")


def _closest(word: str, names: list[str]) -> str:
    near = difflib.get_close_matches(word, names, n=3, cutoff=0.4)
    return f"; did you mean {', '.join(near)}?" if near else ""


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        node = OmegaConf.load(path)
    except Exception as exc:  # yaml errors carry line numbers in their text
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)  # yaml's MarkedYAMLError: 0-based line
        where = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        raise UserError(
            f"{path}:{where} not valid YAML ({first}{f': {problem}' if problem else ''})"
        ) from None
    if not isinstance(node, DictConfig):
        raise UserError(f"{path}: expected a mapping at the top level")
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=False))


def _recipe_choices(path: Path, body: dict[str, Any]) -> dict[str, str]:
    choices = dict(DEFAULT_CHOICES)
    for item in body.pop("defaults", []) or []:
        if item == "_self_":
            continue
        if not isinstance(item, dict) or len(item) != 1:
            raise UserError(f"{path}: defaults entries must be 'group: option', got {item!r}")
        ((group, option),) = item.items()
        group = str(group).removeprefix("override ").lstrip("/")
        if group not in GROUPS:
            raise UserError(
                f"{path}: unknown config group {group!r}{_closest(group, list(GROUPS))}"
            )
        if option not in list_options(group):
            hint = _closest(str(option), list_options(group))
            raise UserError(f"{path}: unknown {group} option {option!r}{hint}")
        choices[group] = str(option)
    return choices


def compose(
    recipe: str, overrides: list[str] | None = None, cluster_file: str | None = None
) -> RootConfig:
    """Compose, type-check and validate a run configuration.

    Args:
        recipe: a shipped recipe name or a path to a recipe YAML file.
        overrides: Hydra overrides (`parallel.tp=4`, `model=llama3_8b`).
        cluster_file: a cluster description (e.g. from `llmctl topo --out`) used as `cluster`.

    Raises:
        UserError: unknown recipe, group, option or key; a value of the wrong type; a
            configuration that fails validation.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    path = resolve_recipe(recipe)
    body = _load_yaml(path)
    if isinstance(body.get("cluster"), dict):
        body["cluster"] = cluster_aliases(body["cluster"])
    choices = _recipe_choices(path, body)
    store = ConfigStore.instance()
    chosen = [o for o in overrides or [] if _override_key(o) == "cluster"]
    if cluster_file is not None and chosen:
        raise UserError(
            f"--cluster-file {cluster_file} and {chosen[0]} both choose the cluster; give one"
        )
    if cluster_file is not None:
        store.store(group="cluster", name=_CLUSTER_FILE_NODE, node=_load_cluster_file(cluster_file))
        choices["cluster"] = _CLUSTER_FILE_NODE
    overrides = list(overrides or [])
    if "cluster=probe" in overrides:  # this host, probed now (llmctl.topology)
        from llmctl.topology.cluster import probed_cluster

        overrides.remove("cluster=probe")
        store.store(group="cluster", name="__llmctl_probe__", node=probed_cluster())
        choices["cluster"] = "__llmctl_probe__"
    store.store(name=_SCHEMA_NODE, node=RootConfig)
    defaults: list[Any] = [_SCHEMA_NODE, *({g: c} for g, c in choices.items()), "_self_"]
    store.store(name=_RECIPE_NODE, node={"defaults": defaults, **body})
    overrides = list(overrides or [])
    overrides = _check_override_keys(overrides)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(resource_dir("configs")), version_base=None):
            raw = hydra_compose(config_name=_RECIPE_NODE, overrides=overrides)
    except Exception as exc:
        raise UserError(_composing_message(exc, str(path)) or _hydra_message(exc)) from None
    finally:
        GlobalHydra.instance().clear()
    raw_dict = cast(dict[str, Any], OmegaConf.to_container(raw, resolve=True))
    raw_dict["recipe"] = path.stem
    cfg = from_dict(raw_dict, source=str(path))
    _adopt_packed_seq_length(cfg, overrides)
    validate(cfg)
    return cfg


def _adopt_packed_seq_length(cfg: RootConfig, overrides: list[str]) -> None:
    """SFT packs (`llmctl data sft`) fix the sequence length: take it from their manifest.

    Raises:
        UserError: `model.seq_length` given on the command line differs from the packs'.
    """
    if not cfg.data.prefixes:
        return
    from llmctl.data.sft import packed_seq_length

    seq = packed_seq_length(list(cfg.data.prefixes))
    if seq is None or seq == cfg.model.seq_length:
        return
    if any(o.lstrip("+~").startswith("model.seq_length=") for o in overrides):
        raise UserError(
            f"model.seq_length={cfg.model.seq_length} but data.prefixes were packed for {seq}; "
            "drop the override or rerun `llmctl data sft --seq-length`"
        )
    cfg.model.seq_length = seq


def from_dict(data: dict[str, Any], source: str = "config") -> RootConfig:
    """Type-check a plain dict against the schema and build the dataclasses."""
    if isinstance(data.get("cluster"), dict):
        data = {**data, "cluster": cluster_aliases(data["cluster"])}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RootConfig), data)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise UserError(f"{source}: {_omegaconf_message(exc)}") from None
    return cast(RootConfig, obj)


def _load_cluster_file(cluster_file: str) -> dict[str, Any]:
    path = Path(cluster_file)
    if not path.is_file():
        raise UserError(f"cluster file {cluster_file} does not exist")
    body = _load_yaml(path)
    body = cluster_aliases(cast(dict[str, Any], body.get("cluster", body)))
    try:
        OmegaConf.merge(OmegaConf.structured(RootConfig).cluster, body)
    except OmegaConfBaseException as exc:
        raise UserError(f"{path}: {_omegaconf_message(exc)}") from None
    return body


def all_keys() -> list[str]:
    """Every dotted key of the schema (for 'did you mean' hints)."""
    root = OmegaConf.structured(RootConfig)
    keys: list[str] = []
    for group in GROUPS:
        keys.extend(f"{group}.{k}" for k in root[group])
    return keys


def _dict_keys() -> set[str]:
    """Dotted keys of dict-typed fields (e.g. launcher.env), which accept new entries."""
    root = OmegaConf.structured(RootConfig)
    return {
        f"{g}.{k}" for g in GROUPS for k in root[g] if isinstance(root[g]._get_node(k), DictConfig)
    }


def _override_key(override: str) -> str:
    """The key an override sets, adds or deletes (`+a.b=1`, `~a.b`: `a.b`)."""
    return re.split(r"[=~]", override.lstrip("+~"), maxsplit=1)[0].strip()


def _check_override_keys(overrides: list[str]) -> list[str]:
    """Reject unknown keys with a hint; let dict fields take new entries (`launcher.env.X=1`)."""
    known = set(all_keys())
    dicts = _dict_keys()
    out = []
    for ov in overrides:
        if "=" not in ov:
            raise UserError(f"override {ov!r} is not key=value")
        key = _override_key(ov)
        if key in GROUPS:
            options = list_options(key)
            value = ov.split("=", 1)[1]
            if value not in options:
                raise UserError(f"unknown {key} option {value!r}{_closest(value, options)}")
        elif any(key == d or key.startswith(d + ".") for d in dicts):
            ov = "++" + ov.lstrip("+")  # struct mode would refuse new keys of a dict field
        elif key != "recipe" and key not in known:
            raise UserError(f"unknown config key {key!r}{_closest(key, sorted(known))}")
        out.append(ov)
    return out


def _hydra_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    head = text[0] if text else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        head = f"{head}: {str(cause).strip().splitlines()[0]}"
    override = getattr(exc, "override", None)  # hydra's OverrideParseException: name it
    if isinstance(override, str) and override not in head:
        head = f"override {override!r}: {head} (Hydra override grammar: key=value)"
    if "is not a ListConfig" in head:
        head += " (a list is written key=[a,b]; quote it for the shell)"
    return head


def _composing_message(exc: BaseException, recipe_path: str) -> str | None:
    """One line for Hydra's multi-line "<X>Error raised while composing config" (a typo'd key
    or a wrongly typed value in a recipe or config file): the file, the dotted key, the problem.
    None when `exc` is not that kind of error."""
    text = [ln.strip() for ln in str(exc).strip().splitlines()]
    match = re.fullmatch(
        r"In '([^']+)': (\w+) raised while composing config:", text[0] if text else ""
    )
    if match is None or len(text) < 2:
        return None
    where = recipe_path if match.group(1) == _RECIPE_NODE else f"configs/{match.group(1)}.yaml"
    key = next((ln.split(":", 1)[1].strip() for ln in text if ln.startswith("full_key:")), "")
    if match.group(2) == "ConfigKeyError" and key:
        names = all_keys() if "." in key else list(GROUPS)
        return f"{where}: unknown config key {key!r}{_closest(key, names)}"
    return f"{where}: {key}: {text[1]}" if key else f"{where}: {text[1]}"


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    msg = str(exc).strip().splitlines()[0]
    key = getattr(exc, "full_key", None)
    return f"{key}: {msg}" if key and key not in msg else msg


def cfg_to_yaml(cfg: RootConfig) -> str:
    """The resolved configuration as YAML text (what a run directory stores)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def load_resolved(path: str | Path) -> RootConfig:
    """Reload a configuration saved by `cfg_to_yaml` and validate it again."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"resolved config {p} does not exist")
    cfg = from_dict(_load_yaml(p), source=str(p))
    validate(cfg)
    return cfg
