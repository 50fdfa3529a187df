"""Shared fixtures: random HF checkpoints of the tiny presets (written once per session), the tolerance
helper, and the `gpu` marker's skip."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from blinkc.random_checkpoint import write_random_checkpoint
from ir import DType
from models.presets import preset_config
from models.registry import resolve_model

# BLINK_GPU_PRECOMPILE=1 where there is no GPU: only the `gpu` tests run, each up to where its kernel would load,
# so that their sm_90 kernels are compiled into the cache for a GPU call to carry (tests/gpu)
PRECOMPILE = not torch.cuda.is_available() and bool(os.environ.get("BLINK_GPU_PRECOMPILE"))
if not torch.cuda.is_available() and not PRECOMPILE:  # kernels run in the Triton interpreter: set before triton loads
    os.environ["TRITON_INTERPRET"] = "1"

TOLERANCES = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """Relative error ||a - e|| / ||e|| under the tolerance of `dtype`; returns the error."""
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), "non-finite values"
    err = relative_error(actual, expected)
    assert err < TOLERANCES[dtype], f"relative error {err:.3g} >= {TOLERANCES[dtype]:g} ({dtype})"
    return err


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(preset) -> directory of a random HF checkpoint (sharded, to exercise the index)."""
    written = {}

    def get(preset: str):
        if preset not in written:
            out = tmp_path_factory.mktemp(preset)
            written[preset] = write_random_checkpoint(preset_config(preset), out, seed=1, std=0.05,
                                                      max_shard_bytes=300_000)
        return written[preset]

    return get


def fp32_model(checkpoint_dir):
    """The model at checkpoint_dir, resolved and switched to fp32 compute."""
    model = resolve_model(checkpoint_dir)
    return dataclasses.replace(model, config=dataclasses.replace(model.config, dtype=DType.f32))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    if PRECOMPILE:
        skip = pytest.mark.skip(reason="BLINK_GPU_PRECOMPILE: only the gpu tests' kernels are compiled")
        for item in items:
            if "gpu" not in item.keywords:
                item.add_marker(skip)
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
