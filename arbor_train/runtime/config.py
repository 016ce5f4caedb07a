"""Compose the runtime configuration from conf/runtime with Hydra's compose API (for library use)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..paths import CONF_DIR


def compose(config_name: str, overrides: list[str] | None = None) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return hydra_compose(config_name=config_name, overrides=overrides or [])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides or [])


def default_config(profile: str = "default", overrides: list[str] | None = None) -> dict:
    """The runtime config of a profile in conf/runtime, as a plain dict.

    overrides use Hydra syntax relative to the runtime node, e.g. ["reranker.kind=heuristic"].
    """
    cfg = compose("runtime_cli", [f"runtime={profile}"] + [f"runtime.{o}" for o in (overrides or [])])
    return OmegaConf.to_container(cfg.runtime, resolve=True)


def runtime_config(c: dict) -> dict:
    """The runtime configuration of the run: its profile, the overrides, then the ablation switches."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        runtime_cfg = default_config(c["runtime_profile"], list(c["runtime_overrides"]))
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(f"option runtime_overrides={c['runtime_overrides']} (runtime_profile="
                          f"{c['runtime_profile']}): {e}") from e
    from .layers import check_layers

    check_layers(runtime_cfg["context"])
    for k, v in c["ablation"].items():
        if k == "name":
            continue
        if k not in runtime_cfg["ablation"]:
            raise ConfigError(f"option ablation.{k} is not a runtime ablation switch ({sorted(runtime_cfg['ablation'])})")
        runtime_cfg["ablation"][k] = v
    return runtime_cfg
