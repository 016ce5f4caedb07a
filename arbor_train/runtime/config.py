"""Compose the runtime configuration from conf/runtime with Hydra's compose API (for library use)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

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
