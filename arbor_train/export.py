"""python -m arbor_train.export run_dir=<training run> out=<bundle dir> [merged=true]

Turns a training run's `final/` folder into a router bundle in the format the runtime defines
(arbor_train/runtime/bundle.py): manifest, PEFT adapter, tokenizer, optional merged safetensors.
`export(cfg) -> Path` is the importable function.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from . import __version__, roles
from .errors import ConfigError, InputError, MissingInputError, OutputExistsError, entry_point, parse_bool
from .paths import CONF_DIR


def load_base(train_cfg: dict, role_json: dict):
    """Rebuild the untrained base exactly as training did (same seed: same head init, same tiny model)."""
    return roles.get(role_json["role"]).load_base(train_cfg, role_json)


def export(run_dir: str | Path, out: str | Path, merged: bool | None = None, overwrite: bool = False,
           log_artifact: bool = True) -> Path:
    run_dir, out = Path(run_dir), Path(out)
    final = run_dir / "final"
    for need in ("adapter", "tokenizer", "role.json", "metrics.json", "config.yaml"):
        if not (final / need).exists():
            raise MissingInputError(f"run_dir={str(run_dir)!r}: final/{need} missing (did training finish?)")
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise OutputExistsError(f"out={str(out)!r} already exists; pass overwrite=true to replace it")
        _check_replaceable(out)
    train_cfg = OmegaConf.to_container(OmegaConf.load(final / "config.yaml"), resolve=True)
    role = _read_json(final / "role.json", "role")
    metrics = _read_json(final / "metrics.json", "data_fingerprint")
    if not isinstance(train_cfg, dict) or not isinstance(train_cfg.get("model"), dict):
        raise InputError(f"{final / 'config.yaml'}: field 'model' missing (not a training run's config)")
    m = train_cfg["model"]
    try:
        r = roles.get(role["role"])
    except ConfigError as e:
        raise InputError(f"{final / 'role.json'}: field 'role': {e}") from e
    kind = r.bundle_kind(m["family"])
    tiny = bool(m.get("tiny"))
    merged = tiny if merged is None else (merged or tiny)  # an in-process base exists nowhere else: merge it
    out.parent.mkdir(parents=True, exist_ok=True)
    # a folder of our own, named uniquely beside `out`: nothing a user made is ever deleted
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".export", dir=out.parent))
    try:
        _build(run_dir, final, tmp, train_cfg, role, metrics, m, r, kind, merged)
        if out.exists():
            _check_replaceable(out)  # again: it may have changed while the bundle was built
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".replaced", dir=out.parent))
            out.rename(old / "bundle")
            try:
                tmp.rename(out)
            except OSError:
                (old / "bundle").rename(out)  # put the old bundle back: a failed export loses nothing
                raise
            finally:
                if not (old / "bundle").exists():
                    shutil.rmtree(old)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    manifest = json.loads((out / "manifest.json").read_text())
    wandb_cfg = (train_cfg.get("logger") or {}).get("wandb")
    if log_artifact and wandb_cfg:
        _log_wandb_artifact(out, manifest, wandb_cfg)
    return out


def _check_replaceable(out: Path) -> None:
    """overwrite=true replaces a bundle, and only a bundle: a real folder holding an arbormem-bundle manifest."""
    mf = out / "manifest.json"
    fmt = None
    if out.is_dir() and not out.is_symlink() and mf.is_file():
        try:
            fmt = json.loads(mf.read_text(encoding="utf-8")).get("format")
        except (ValueError, UnicodeDecodeError, AttributeError):
            fmt = None
    if fmt != "arbormem-bundle":
        raise OutputExistsError(f"out={str(out)!r} exists and is not a bundle (no arbormem-bundle manifest.json"
                                + (", it is a link" if out.is_symlink() else "") + "); overwrite=true replaces only "
                                "a bundle, so it was left as it is: choose another out")


def _build(run_dir: Path, final: Path, tmp: Path, train_cfg: dict, role: dict, metrics: dict, m: dict, r,
           kind: str, merged: bool) -> None:
    shutil.copytree(final / "adapter", tmp / "adapter")
    shutil.copytree(final / "tokenizer", tmp / "tokenizer")
    if merged:
        from peft import PeftModel

        model = PeftModel.from_pretrained(load_base(train_cfg, role), str(final / "adapter"))
        model.merge_and_unload().save_pretrained(str(tmp / "merged"), safe_serialization=True)
    manifest = {
        "role": role["role"], "kind": kind,
        "base_model": {"ref": m["ref"] or f"inline:{m['name']}", "name": m["name"], "seed": train_cfg["seed"]},
        "adapter": "adapter", "merged": "merged" if merged else None, "tokenizer": "tokenizer",
        "prompt_template": r.prompt_template(kind),
        "max_length": train_cfg["task"].get("max_length", 256),
        "metrics": metrics.get("metrics", {}), "baselines": metrics.get("baselines", {}),
        "data_fingerprint": metrics["data_fingerprint"],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "arbor_train_version": __version__, "git_commit": metrics.get("git_commit", "unknown"),
        "training_run": str(run_dir),
    }
    manifest.update({k: v for k, v in role.items() if k not in ("role", "task")})  # the role's extras
    from .runtime.bundle import write_manifest

    write_manifest(tmp, manifest)


def _read_json(path: Path, required: str) -> dict:
    """A run's JSON record: an object with the `required` field, else an InputError naming the file."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: invalid JSON ({e})") from e
    if not isinstance(d, dict) or required not in d:
        raise InputError(f"{path}: missing field {required!r}")
    if not isinstance(d[required], str):
        raise InputError(f"{path}: field {required!r} must be a string, got {type(d[required]).__name__}")
    return d


def _log_wandb_artifact(out: Path, manifest: dict, wandb_cfg: dict) -> None:
    import os

    import wandb

    mode = os.environ.get("WANDB_MODE", wandb_cfg.get("mode", "offline"))
    run = wandb.init(project=wandb_cfg["project"], job_type="export", mode=mode,
                     dir=str(out.parent), name=f"export-{out.name}", reinit=True)
    art = wandb.Artifact(name=f"{manifest['role']}-{manifest['base_model']['name']}", type="router-bundle",
                         metadata={k: manifest[k] for k in ("role", "kind", "base_model", "metrics", "data_fingerprint")})
    art.add_dir(str(out))
    run.log_artifact(art)
    run.finish()


def check_options(cfg: DictConfig) -> dict:
    """The command's options read strictly (run_dir and out required, booleans true/false)."""
    for key in ("run_dir", "out"):
        if OmegaConf.is_missing(cfg, key) or not cfg[key]:
            raise ConfigError(f"option {key} is required: python -m arbor_train.export run_dir=<training run dir> "
                              f"out=<bundle dir>")
    o = {"run_dir": str(cfg.run_dir), "out": str(cfg.out),
         "merged": None if cfg.merged is None else parse_bool(cfg.merged, "merged"),
         "overwrite": parse_bool(cfg.overwrite, "overwrite"),
         "log_artifact": parse_bool(cfg.log_artifact, "log_artifact")}
    if not Path(o["run_dir"]).is_dir():
        raise MissingInputError(f"option run_dir={o['run_dir']!r}: no such folder")
    return o


@hydra.main(config_path=str(CONF_DIR), config_name="export", version_base="1.3")
@entry_point
def main(cfg: DictConfig) -> None:
    o = check_options(cfg)
    p = export(o["run_dir"], o["out"], o["merged"], o["overwrite"], o["log_artifact"])
    print(f"wrote bundle {p}")


if __name__ == "__main__":
    main()
