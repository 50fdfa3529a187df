"""Every environment variable Blink reads, in one place."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """BLINK_CACHE_DIR: random checkpoints and (later) compiled kernels. Default ~/.cache/blink."""
    return Path(os.environ.get("BLINK_CACHE_DIR") or Path.home() / ".cache" / "blink")


def use_interpreter_without_gpu() -> bool:
    """Without a CUDA GPU, kernels run in the Triton interpreter: TRITON_INTERPRET=1 must be set before
    triton is first imported. Returns whether the interpreter is in use."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"
