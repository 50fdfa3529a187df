"""Every environment variable Blink reads, in one place."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """BLINK_CACHE_DIR: random checkpoints and (later) compiled kernels. Default ~/.cache/blink."""
    return Path(os.environ.get("BLINK_CACHE_DIR") or Path.home() / ".cache" / "blink")
