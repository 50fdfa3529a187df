"""The Gluon kernels one request runs on, compiled ahead of time (`runtime.gluon_kernels`): what `blinkc compile`
compiles for a Hopper target, and when a launch takes the cache's cubin rather than Triton's JIT."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from codegen.gluon import chain, gemv
from runtime.gluon_kernels import UNALIGNED, Ahead, kernel_key

ROOT = Path(__file__).resolve().parents[2]
COMPILE = """
from blinkc.build import HOPPER_SMS, build_graph
from codegen.config import CompileConfig
from codegen.lower import lower
from models.registry import resolve_model
from runtime.gluon import precompile_runner
config = CompileConfig(max_batch=1, max_tokens_per_step=256, max_model_len=512, max_new_tokens=8)
lw = lower(build_graph(resolve_model("llama3-8b"), config), config)
room = tuple(lw.layout.regions[n].size if n in lw.layout.regions else 0 for n in ("prefill_parts", "tickets:prefill"))
print([p.name for p in precompile_runner("one", lw.tasks.task_table(), lw.tasks.desc_table().tolist(),
                                         config.to_dict(), HOPPER_SMS, room)])
"""


@pytest.mark.parametrize("fn, signature", [(chain.prefill_chain, chain.SIGNATURE),
                                           (chain.decode_chain, chain.DECODE_SIGNATURE),
                                           (gemv.linear_gemv, gemv.SIGNATURE)])
def test_the_kernels_take_their_runtime_arguments_first(fn, signature):
    """A launch passes the runtime arguments positionally and the constexprs after them, by their place in the
    kernel's arguments: the signature must name the kernel's first ones."""
    Ahead(fn, signature)


def test_a_kernel_whose_arguments_are_not_the_signature_is_refused():
    with pytest.raises(ValueError, match="does not take"):
        Ahead(gemv.linear_gemv, {"W": "*bf16", "DESCS": "*i64"})


def test_a_launch_takes_the_cubin_only_for_what_it_was_compiled_for():
    """Pointers of the signature's types, 16-byte aligned but the counters after the stop word; int32s in range."""
    kernel = Ahead(gemv.linear_gemv, gemv.SIGNATURE)
    descs, w, act, f32 = (torch.zeros(64, dtype=t) for t in (torch.int64, torch.bfloat16, torch.bfloat16,
                                                              torch.float32))
    assert kernel._fits((descs, w, act, f32, 3, 100))
    assert not kernel._fits((descs, w, act, f32[1:], 3, 100))  # (off 16 bytes)
    assert not kernel._fits((descs, w.float(), act, f32, 3, 100))  # (a pointer of another type)
    assert not kernel._fits((descs, w, act, f32, 3, 2**31))
    assert not kernel._fits((descs, w, act, f32, 3))
    assert "EVENTS" in UNALIGNED and "EVENTS" in chain.SIGNATURE


def test_a_key_a_kernel_and_its_constexprs():
    base = chain.decode_constexprs(16, 16, 32, 1, True, 16, 1, 256, max_new=8, sample_wide=4096)
    key = kernel_key(chain.decode_chain, base, chain.DECODE_LAUNCH)
    assert key == kernel_key(chain.decode_chain, dict(base), dict(chain.DECODE_LAUNCH))
    assert key != kernel_key(chain.decode_chain, {**base, "SAMPLING": True}, chain.DECODE_LAUNCH)
    assert key != kernel_key(chain.prefill_chain, base, chain.DECODE_LAUNCH)
    assert key != kernel_key(chain.decode_chain, base, {**chain.DECODE_LAUNCH, "maxnreg": 96})


def test_one_requests_gluon_kernels_compile_ahead_into_the_cache(tmp_path):
    """For Llama-3-8B at batch 1: the prefill chain, the LM head's GEMV, the loop greedy and sampling, and a short
    prompt's stream-K projections (plain, gated, QKV) and attention, compiled for sm_90 into `cubins/gluon-KEY` (a
    process of its own: the tests' Triton is the interpreter's)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"BLINK_CACHE_DIR": str(tmp_path),
                                                                              "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", COMPILE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    names = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert len(set(names)) == len(names) == 8 and all(name.startswith("gluon-") for name in names)
    kernels = [json.loads((tmp_path / "cubins" / name / "kernel.json").read_text())["name"] for name in names]
    assert sorted(kernels) == ["attention_prefill", "decode_chain", "decode_chain", "linear_gemv", "linear_prefill",
                               "linear_prefill", "prefill_chain", "qkv_prefill"]
    assert all((tmp_path / "cubins" / name / "kernel.cubin").stat().st_size > 0 for name in names)


def test_a_batchs_gluon_kernels_are_compiled_beside_a_kernel_for_more_than_one(monkeypatch):
    """`precompile_runner("batch")`: the batched loop greedy and sampling (`Batch`'s launches), for a kernel of more
    than one request a launch; none for a kernel of one (`blinkc.build` runs it only for more)."""
    from blinkc.build import HOPPER_SMS, build_graph
    from codegen.config import CompileConfig
    from codegen.gluon import batch
    from codegen.lower import lower
    from models.registry import resolve_model
    from runtime import gluon_kernels
    from runtime.gluon import precompile_runner

    compiled = []
    monkeypatch.setattr(gluon_kernels, "precompile", lambda *launch: compiled.append(launch) or Path("gluon-x"))
    for max_batch in (8, 1):
        config = CompileConfig(max_batch=max_batch, max_tokens_per_step=256, max_model_len=512, max_new_tokens=8)
        lw = lower(build_graph(resolve_model("llama3-8b"), config), config)
        room = tuple(lw.layout.regions[n].size if n in lw.layout.regions else 0
                     for n in ("prefill_parts", "tickets:prefill"))
        precompile_runner("batch", lw.tasks.task_table(), lw.tasks.desc_table().tolist(), config.to_dict(),
                          HOPPER_SMS, room)
    assert [(fn, constexprs["SAMPLING"], constexprs["REQS"]) for fn, _, constexprs, _ in compiled] == [
        (batch.batch_chain, False, 32), (batch.batch_chain, True, 32)]


class _Recorder:
    """Stands in for a kernel launcher: `kernel[grid](*args, **kwargs)` records what it was given."""

    def __init__(self) -> None:
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, args, kwargs))


def _body(DESCS, W, n, A, B=3):  # (a kernel's arguments: the runtime ones, then constexprs, one with a default)
    pass


def test_a_launch_passes_the_cubin_every_argument_in_the_kernels_order(monkeypatch):
    """From the cache: the runtime arguments, then each constexpr's value in the kernel's order (a default where the
    launch names none), as Triton's JIT passes them to its launcher; without a cubin, the JIT as called."""
    jit = _Recorder()
    jit.fn = _body
    kernel = Ahead(jit, {"DESCS": "*i64", "W": "*bf16", "n": "i32"})
    descs, w = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.bfloat16)
    cubin = _Recorder()
    monkeypatch.setattr(kernel, "_compiled", lambda constexprs, options: cubin)
    kernel[(8, )](descs, w, 5, A=7, num_warps=4)
    assert cubin.calls == [((8, 1, 1), (descs, w, 5, 7, 3), {})] and kernel.launches_ahead == 1
    monkeypatch.setattr(kernel, "_compiled", lambda constexprs, options: None)
    kernel[(8, )](descs, w, 5, A=7, num_warps=4)
    assert jit.calls == [((8, 1, 1), (descs, w, 5), {"A": 7, "num_warps": 4})] and kernel.launches_jit == 1


def test_a_cubin_in_the_cache_is_loaded_once_with_its_constexprs(monkeypatch, tmp_path):
    """`Ahead._compiled`: the cache's folder for the launch's constexprs and options (`gluon-KEY`), loaded the first
    time with the kernel's whole signature (a constexpr typed so, its value given) and kept; a launch of other
    constexprs, not in the cache, gets None (the JIT)."""
    import runtime.megakernel
    from runtime import gluon_kernels

    monkeypatch.setenv("BLINK_CACHE_DIR", str(tmp_path))
    jit = _Recorder()
    jit.fn = _body
    kernel = Ahead(jit, {"DESCS": "*i64", "W": "*bf16", "n": "i32"})
    where = gluon_kernels.folder(jit, {"A": 7, "B": 3}, {"num_warps": 4})
    where.mkdir(parents=True)
    (where / "kernel.json").write_text(json.dumps({"name": "_body"}))
    (where / "kernel.cubin").write_bytes(b"cubin")
    loads = []
    monkeypatch.setattr(runtime.megakernel, "compiled_kernel", lambda *args: loads.append(args) or "loaded")
    assert kernel._compiled({"A": 7, "B": 3}, {"num_warps": 4}) == "loaded"
    assert kernel._compiled({"B": 3, "A": 7}, {"num_warps": 4}) == "loaded" and len(loads) == 1
    name, signature, metadata, cubin, key, constants = loads[0]
    assert signature == {"DESCS": "*i64", "W": "*bf16", "n": "i32", "A": "constexpr", "B": "constexpr"}
    assert (metadata, cubin, key, constants) == ({"name": "_body"}, b"cubin", where.name, {"A": 7, "B": 3})
    assert kernel._compiled({"A": 8, "B": 3}, {"num_warps": 4}) is None
