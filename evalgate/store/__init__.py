"""The store (docs/storage.md): one module per concern, joined in evalgate/store/store.py."""

from .loaded import BASELINE_RESCORING, OWN_RESCORING, RunRecord
from .models import Run
from .runs import display_status
from .store import Store, existing_store, open_store

__all__ = ["BASELINE_RESCORING", "OWN_RESCORING", "Run", "RunRecord", "Store", "display_status", "existing_store", "open_store"]
