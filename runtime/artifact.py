"""The compiled artifact: `model.cubin` plus, beside it, a versioned manifest (`model.cubin.json`), the
kernel source (`model.cubin.py`, what the Triton interpreter runs on a CPU) and the task tables
(`model.cubin.tables.safetensors`). The runtime checks the manifest before it loads anything.

torch and safetensors load with the tables, not with this module: a compile that the cache answers
copies an artifact's files and writes its manifest without them."""
from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FORMAT = "blink-megakernel"
# 2: weight transforms (norms folded into projections, gate/up rows interleaved)
# 3: the control word `logits_seqs` (the rows of the last step with sequences: `Megakernel.last_step_rows`)
# 4: the control word `error_kind` (who recorded a hang, apart from the abort flag the host may write)
VERSION = 4


@dataclass(frozen=True)
class Artifact:
    manifest: dict[str, Any]
    tables: dict[str, torch.Tensor]  # tasks, descs, and rotary inverse frequencies by region name
    source_path: Path
    cubin_path: Path | None  # None when compiled for the interpreter only

    @classmethod
    def load(cls, path: Path) -> Artifact:
        path = Path(path)
        manifest_path = companion(path, ".json")
        if not manifest_path.exists():
            raise ValueError(f"{path}: no manifest {manifest_path.name} beside it (not a blinkc artifact?)")
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{manifest_path}: malformed manifest ({err.msg})") from None
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{manifest_path}: not a {FORMAT} manifest")
        if manifest.get("version") != VERSION:
            raise ValueError(f"{manifest_path}: manifest version {manifest.get('version')}, "
                             f"this runtime reads {VERSION}")
        from safetensors.torch import load_file

        cubin = path if path.exists() and manifest["kernel"].get("cubin") else None
        return cls(manifest, load_file(companion(path, ".tables.safetensors")), companion(path, ".py"), cubin)

    def save(self, path: Path, cubin: bytes | None) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        companion(path, ".json").write_text(json.dumps(self.manifest, indent=1) + "\n")
        save_file({k: v.contiguous() for k, v in self.tables.items()}, companion(path, ".tables.safetensors"))
        if self.source_path != companion(path, ".py"):
            companion(path, ".py").write_text(self.source_path.read_text())
        if cubin is not None:
            path.write_bytes(cubin)


def companion(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def import_source(path: Path) -> ModuleType:
    """Imports a rendered kernel module (Triton's JIT reads the source from the file)."""
    name = f"blink_kernel_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
