"""The runtime configuration: conf/runtime composed with Hydra, in one grammar everywhere.

On any command line, and in Python, the runtime is addressed with the same overrides:

    runtime/components=tuned          one of conf/runtime/components (which model plays which role)
    runtime/read_policy=cross_session one of conf/runtime/read_policy (the read path, runtime.context)
    runtime/domain=group_chat         one of conf/runtime/domain (one user and an assistant, or a group chat)
    runtime.reranker.bundle.path=...  any single key

Entry points carry the `runtime` group in their defaults, so Hydra composes it once with the rest of their
options; `default_config` composes the same tree for library use.
"""

from __future__ import annotations

from collections.abc import Iterable

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..paths import CONF_DIR

AXES = ("components", "read_policy", "domain")
BASE_CHOICES = {"components": "heuristic", "read_policy": "default", "domain": "assistant"}


def compose(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name=config_name, overrides=overrides or [])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides or [])


def options(axis: str) -> list[str]:
    """The shipped choices of one axis (file names in conf/runtime/<axis>)."""
    return sorted(p.stem for p in (CONF_DIR / "runtime" / axis).glob("*.yaml"))


def check_overrides(overrides: Iterable[str], option: str = "runtime") -> list[str]:
    """Overrides in the runtime grammar (runtime/<axis>=<choice> or runtime.<key>=<value>); anything else,
    or a choice that is not shipped, is refused naming it."""
    out = []
    for o in overrides:
        if not isinstance(o, str) or "=" not in o:
            raise ConfigError(f"option {option}: {o!r} is not an override (runtime/<axis>=<choice> or runtime.<key>=<value>)")
        key, value = o.split("=", 1)
        key = key.lstrip("+~")
        if key.startswith("runtime/"):
            axis = key.split("/", 1)[1]
            if axis not in AXES:
                raise ConfigError(f"option {option}: {key} names no runtime axis (runtime/{', runtime/'.join(AXES)})")
            if value not in options(axis):
                raise ConfigError(f"option {key}={value}: not one of {', '.join(options(axis))}")
        elif not key.startswith("runtime."):
            raise ConfigError(f"option {option}: {o!r} does not address the runtime "
                              "(runtime/<axis>=<choice> or runtime.<key>=<value>)")
        out.append(o)
    return out


def default_config(*overrides: str) -> dict:
    """The runtime config as a plain dict, from overrides in the command line's grammar, e.g.
    default_config("runtime/components=tuned", "runtime.reranker.bundle.path=outputs/bundles/reranker")."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if len(overrides) == 1 and isinstance(overrides[0], (list, tuple)):
        overrides = tuple(overrides[0])
    try:
        cfg = compose("runtime_cli", check_overrides(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"runtime overrides {list(overrides)}: {e}") from e
    return OmegaConf.to_container(cfg.runtime, resolve=True)


def choices(runtime_cfg: dict) -> dict[str, str]:
    """Which option of each axis the config was composed from (each option file records its name)."""
    return {a: runtime_cfg.get("choices", {}).get(a, BASE_CHOICES[a]) for a in AXES}


def label(runtime_cfg: dict) -> str:
    """A short name for a composed runtime: its components, then the read policy and domain where they
    are not the base ones (e.g. `tuned_every_kind/cross_session`)."""
    ch = choices(runtime_cfg)
    return "/".join([ch["components"], *(ch[a] for a in AXES[1:] if ch[a] != BASE_CHOICES[a])])


def settings(runtime_cfg: dict) -> list[str]:
    """The keys of a composed runtime that differ from what its choices alone compose to, as
    `runtime.<key>=<value>` overrides (what a command line set on top of the choices)."""
    base = default_config(*(f"runtime/{a}={c}" for a, c in choices(runtime_cfg).items()))

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            if isinstance(v, dict) and v:
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(runtime_cfg), flat(base)
    return [f"runtime.{k}={a[k] if a[k] is not None else 'null'}" for k in sorted(a) if a.get(k) != b.get(k)]


def runtime_config(c: dict) -> dict:
    """The runtime of an entry point's composed config (its `runtime` node), with the read layers checked
    and the run's ablation switches (`ablation=<name>` of eval) applied."""
    from .layers import check_layers

    if "runtime" not in c or not isinstance(c["runtime"], dict):
        raise ConfigError("this entry point has no runtime group (add `- runtime: default` to its defaults)")
    runtime_cfg = dict(c["runtime"])
    check_layers(runtime_cfg["context"])
    runtime_cfg["ablation"] = dict(runtime_cfg["ablation"])
    for k, v in (c.get("ablation") or {}).items():
        if k == "name":
            continue
        if k not in runtime_cfg["ablation"]:
            raise ConfigError(f"option ablation.{k} is not a runtime ablation switch ({sorted(runtime_cfg['ablation'])})")
        runtime_cfg["ablation"][k] = v
    return runtime_cfg
