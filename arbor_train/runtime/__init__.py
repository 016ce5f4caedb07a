"""Reference ArborMem runtime: memory forest, state localization, context assembly, evidence store."""

from .bundle import Bundle, BundleError, load_bundle, write_manifest
from .config import default_config
from .context import Context, TokenCounter, question_intents
from .extract import Extraction, ExtractorSet, TurnInput
from .memory import ArborMemory, build_components
from .schema import Candidate, Localization, Node
from .store import Store

__all__ = [
    "ArborMemory", "Bundle", "BundleError", "Candidate", "Context", "Extraction", "ExtractorSet", "Localization",
    "Node", "Store", "TokenCounter", "TurnInput", "build_components", "default_config", "load_bundle",
    "question_intents", "write_manifest",
]
