"""Repository locations (the toolkit is installed editable: `pip install -e .`)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"
