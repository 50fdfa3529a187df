"""The Gluon bodies (codegen/gluon) where there is no GPU: they compile for sm_90 and fit one program an SM, and the
host-driven executor takes them only where they apply. Their results are checked on the GPU
(tests/gpu/test_megakernel_gpu.py, against the reference through the host-driven executor; benchmarks/gluon_groups.py,
group by group against the Triton bodies)."""
from __future__ import annotations

import pytest

from codegen.bodies.linear import LINEAR_FIELDS, OUT_ALIGNED, OUT_F32
from codegen.gluon import compile_for_sm90
from codegen.gluon import linear

SHARED_PER_SM = 232448  # sm_90's shared memory for one block (227 KB)


@pytest.mark.parametrize("tiles", [linear.WIDE, linear.NARROW], ids=["128x256", "128x128"])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_linear_prefill_compiles_for_sm90_and_fits_an_sm(tiles, gated):
    used = compile_for_sm90(linear.linear_prefill, linear.SIGNATURE, tiles.constexprs(gated, True), **linear.LAUNCH)
    assert used.registers <= linear.LAUNCH["maxnreg"]
    assert used.registers * 32 * (linear.CONSUMER_WARPS + 4) <= 65536  # a program's 12 warps' registers fit an SM
    assert used.shared_bytes <= SHARED_PER_SM
    # the wide ungated tile's epilogue holds the products, the residual and the outputs' sums at once: it spills
    # 184 B at 168 registers (measured with it: o_proj 113.9 us against the Triton group's 157 at 2,048 tokens)
    assert used.stack_bytes <= (256 if tiles == linear.WIDE and not gated else 0)


def words(**fields) -> list[int]:
    values = dict.fromkeys(LINEAR_FIELDS, 0)
    values.update(x_off=8, x_stride=4096, k=4096, w_off=16, n=4096, out_off=64, out_stride=4096, out_kind=OUT_ALIGNED,
                  stats_off=-1, res_off=-1, res_stride=4096, bias_off=-1, out_stats_off=-1, route_ticket=-1)
    values.update(fields)
    return [values[f] for f in LINEAR_FIELDS]


def test_linear_prefill_takes_aligned_projections_of_the_steps_tokens():
    assert linear.unsupported(words()) is None
    assert linear.unsupported(words(res_off=4104, gated=1)) is None
    assert "bf16 rows" in linear.unsupported(words(out_kind=OUT_F32))
    assert "routes" in linear.unsupported(words(route_ticket=100))
    assert "last rows" in linear.unsupported(words(rows_kind=1))
    assert "x_off 12" in linear.unsupported(words(x_off=12))
    assert "residual" in linear.unsupported(words(res_off=4100))


def test_linear_prefill_tiles_are_the_shape_whose_rounds_end_first():
    assert linear.tiles_for(2048, 4096, 132) == linear.WIDE  # 256 tiles, 2 rounds; narrow 4
    assert linear.tiles_for(2048, 28672, 132) == linear.WIDE  # 14 rounds; narrow 28
    assert linear.tiles_for(512, 4096, 132) == linear.NARROW  # 1 round either way
    assert linear.tiles_for(512, 28672, 132) == linear.NARROW  # 4 rounds; narrow 7


def test_the_host_driven_executor_refuses_gluon_bodies_without_a_hopper_gpu(tmp_path):
    from blinkc.compile_model import WeightsSource, compile_model
    from codegen.config import CompileConfig
    from models.registry import resolve_model
    from runtime.host_driven import HostDriven
    from runtime.megakernel import Megakernel

    config = CompileConfig(max_batch=1, max_tokens_per_step=32, max_model_len=64, max_new_tokens=4, interpret=True)
    path = compile_model(resolve_model("tiny-llama"), config, tmp_path / "model.cubin", WeightsSource(seed=1)).path
    with pytest.raises(ValueError, match="Hopper"):
        HostDriven(Megakernel.load(path, device="cpu"), gluon=True)
