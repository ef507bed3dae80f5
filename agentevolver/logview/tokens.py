"""Token ids -> text for the token view, with the run's tokenizer when one can be found cheaply.

Dumps hold ids only (token-in/token-out), so text needs a tokenizer: the one given with ``--tokenizer``
(a folder or a built-in name such as ``tiny-test``), else the one a trainer checkpoint of the run saved
(``global_step_<N>/actor/huggingface``). When neither exists or loading fails, the page shows ids and
says why; the conversation (``messages``) is readable either way.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from pathlib import Path
from typing import Any

__all__ = ["TokenDecoder", "checkpoint_tokenizer"]

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def checkpoint_tokenizer(run_path: Path) -> Path | None:
    """The tokenizer folder of the run's latest checkpoint, if it saved one."""
    candidates = []
    try:
        for child in run_path.iterdir():
            match = _STEP_DIR.match(child.name)
            if match:
                candidates.append((int(match.group(1)), child / "actor" / "huggingface"))
    except OSError:
        return None
    for _, folder in sorted(candidates, reverse=True):
        if any((folder / name).is_file() for name in _TOKENIZER_FILES):
            return folder
    return None


class TokenDecoder:
    """Loads tokenizers on first use (once per source) and decodes ids one token at a time."""

    def __init__(self, configured: str | None) -> None:
        self.configured = configured
        self._loaded: dict[str, Any] = {}
        self._failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def preload(self) -> None:
        """Load the ``--tokenizer`` now (importing transformers takes seconds), so the first episode page is fast."""
        if self.configured:
            with contextlib.suppress(RuntimeError):  # the failure is kept and shown on the episode page
                self._tokenizer(self.configured)

    def source_for(self, run_path: Path) -> str | None:
        if self.configured:
            return self.configured
        found = checkpoint_tokenizer(run_path)
        return str(found) if found is not None else None

    def _tokenizer(self, source: str) -> Any:
        with self._lock:
            if source in self._loaded:
                return self._loaded[source]
            if source in self._failed:
                raise RuntimeError(self._failed[source])
            try:
                from transformers import AutoTokenizer

                from agentevolver.models import resolve_model_path

                tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(source))
            except Exception as err:  # any failure means "show ids", with the reason on the page
                self._failed[source] = f"{type(err).__name__}: {err}"
                logger.warning("tokenizer %s could not be loaded: %s", source, err)
                raise RuntimeError(self._failed[source]) from err
            self._loaded[source] = tokenizer
            return tokenizer

    def decode(self, run_path: Path, ids: list[int]) -> tuple[list[str] | None, str]:
        """Per-token texts (None when unavailable) and a line saying where they came from or why not."""
        source = self.source_for(run_path)
        if source is None:
            return None, ("no tokenizer: start the viewer with --tokenizer <model folder or built-in name> "
                          "to see token text; showing token ids")
        try:
            tokenizer = self._tokenizer(source)
            texts = tokenizer.batch_decode([[token] for token in ids], skip_special_tokens=False,
                                           clean_up_tokenization_spaces=False)
        except Exception as err:  # an id outside the vocabulary, or a failed load
            return None, f"tokenizer {source} failed ({err}); showing token ids"
        return texts, f"token text decoded with {source}"
