"""The Gluon bodies (codegen/gluon) where there is no GPU: they compile for sm_90 and fit one program an SM, and the
host-driven executor takes them only where they apply. Their results are checked on the GPU
(tests/gpu/test_megakernel_gpu.py, against the reference through the host-driven executor; benchmarks/gluon_groups.py,
group by group against the Triton bodies)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from codegen.bodies.linear import LINEAR_FIELDS, OUT_ALIGNED, OUT_F32, OUT_NARROW
from codegen.bodies.attention import ATTENTION_FIELDS
from codegen.bodies.qkv import QKV_FIELDS
from codegen.gluon import attention, gemv, linear, qkv, tiles
from codegen.tasks import Kind

SHARED_PER_SM = 232448  # sm_90's shared memory for one block (227 KB)


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    """Every Gluon body's variants compiled for sm_90 (`python -m codegen.gluon`), in a process without the
    interpreter these tests run Triton under."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "codegen.gluon", "--json"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_every_body_compiles_for_sm90_and_fits_an_sm(compiled):
    # linear_prefill: two tile shapes, gated or not, fp64 or fp32 sums; qkv_prefill: two tile shapes, either sums;
    # attention_prefill: items of 128 or 64 rows, 32 or 64 sequences' lanes; linear_gemv: 3 unit heights, plain,
    # gated or the logits; qkv_gemv: 3 unit heights; attention's split decode steps: 32 or 64 sequences' lanes;
    # stream-K: linear_prefill gated or not, qkv_prefill; the persistent chains, prefill and one-row (a step, and
    # the loop over steps), and a batched decode step's
    assert len(compiled) == 38
    for name, used in compiled.items():
        assert used["registers"] <= used["maxnreg"], name
        # a program's warps (the consumers', a loader's warp group) and their registers fit an SM (the GEMV's two)
        per_sm = gemv.PER_SM if name.startswith(("linear_gemv", "qkv_gemv", "decode_chain")) else 1
        assert used["registers"] * 32 * (used["num_warps"] + 4) * per_sm <= 65536, name
        assert (used["shared_bytes"] + 1024) * per_sm <= SHARED_PER_SM + 1024, name
        # the wide ungated tile's epilogue holds the products, the residual and the outputs' sums at once: it spills
        # 184 B at 168 registers (measured with it: o_proj 3,316 us against the Triton groups' 4,766 at 2,048 tokens);
        # attention 32-48 B
        spills = 256 if name.startswith(f"linear_prefill 128x{linear.WIDE.bn}") and "gated" not in name else 0
        # QKV's two heads a tile: its epilogue's 16-byte stores take 104 B more than the 2-byte ones did
        spills = 128 if name.startswith(f"qkv_prefill 128x{linear.WIDE.bn}") else spills
        # the chain holds both in one allocation: 408 B; the one-row chain with a step's plan, rows and sampling
        # inlined 112 B (8 without them; outlined, a function's barriers are the whole CTA's, which a warp-specialized
        # partition cannot take), 200 B with the sampling cut's passes (launched only where a request samples)
        spills = 512 if name == "prefill_chain" else 128 if name.startswith("decode_chain") else spills
        spills = 256 if name.endswith("sampling with temperatures") else spills
        # (the batched chain: 376 B with the loader at 40 registers; 232 with it at 128 and the consumers' bodies
        # deriving their addresses in the loop over groups, session 77)
        spills = 256 if name == "batch_chain" else spills
        # (attention's loader, at 40 registers, carries an item's words two items ahead: 80 B, session 71)
        assert used["stack_bytes"] <= (96 if name.startswith("attention") else spills), name
    # the batched chain's bodies take their pointers offset by an opaque zero (`batch._consumer`): a multiple of 8, or
    # Triton knows no alignment and every global access is one element wide (none of 8 or 16 bytes from c65b68c on,
    # 307 with the zero times 8, session 78)
    assert compiled["batch_chain"]["vector_accesses"] >= 200


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
    assert "bias_off 8" in linear.unsupported(words(bias_off=8))


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


def test_qkv_prefill_takes_heads_of_128_with_rotary_over_all_of_them():
    values = dict.fromkeys(QKV_FIELDS, 0)
    values.update(x_off=8, k=4096, w_off=16, num_q_heads=32, num_kv_heads=8, head_dim=128, rotary_dim=128,
                  q_out_off=64, step_kv_off=-1)
    assert qkv.unsupported([values[f] for f in QKV_FIELDS]) is None
    assert "64 dimensions" in qkv.unsupported([{**values, "head_dim": 64, "rotary_dim": 64}[f] for f in QKV_FIELDS])
    assert "rotary covers 96" in qkv.unsupported([{**values, "rotary_dim": 96}[f] for f in QKV_FIELDS])
    # the epilogue's regions: 16-byte accesses from offsets it takes for multiples of 64 elements
    assert "rope_off 8 is not a multiple of 64" in qkv.unsupported([{**values, "rope_off": 8}[f] for f in QKV_FIELDS])
    assert "step_kv_off 72" in qkv.unsupported([{**values, "step_kv_off": 72}[f] for f in QKV_FIELDS])
    assert qkv.unsupported([{**values, "q_norm_off": -1}[f] for f in QKV_FIELDS]) is None  # (no q/k norm)


def test_attention_prefill_takes_heads_of_128_and_fp32_scores():
    values = dict.fromkeys(ATTENTION_FIELDS, 0)
    values.update(q_off=128, out_off=64, num_heads=32, num_kv_heads=8, head_dim=128)
    words = [values[f] for f in ATTENTION_FIELDS]
    assert attention.unsupported(words, 16, False) is None
    assert "bf16" in attention.unsupported(words, 16, True)
    assert "pages of 48" in attention.unsupported(words, 48, False)
    assert "64 dimensions" in attention.unsupported([{**values, "head_dim": 64}[f] for f in ATTENTION_FIELDS], 16,
                                                    False)
    assert "q_off 8 is not a multiple of 64" in attention.unsupported([{**values, "q_off": 8}[f]
                                                                       for f in ATTENTION_FIELDS], 16, False)


def llama_coverage(**fields):
    """`GluonCoverage` of Llama-3-8B's task tables (lowered here, no kernel compiled), on 132 SMs."""
    from types import SimpleNamespace

    from blinkc.build import build_graph
    from codegen.config import CompileConfig
    from codegen.lower import lower
    from models.registry import resolve_model
    from runtime.gluon import GluonCoverage
    from runtime.host_driven import contiguous_groups

    config = CompileConfig(**{**dict(max_model_len=512, max_new_tokens=8), **fields})
    lw = lower(build_graph(resolve_model("llama3-8b"), config), config)
    tasks = lw.tasks.task_table()
    groups = contiguous_groups(tasks[:, 3].tolist())
    room = tuple(lw.layout.regions[name].size if name in lw.layout.regions else 0
                 for name in ("prefill_parts", "tickets:prefill"))
    return GluonCoverage(tasks, lw.tasks.desc_table().tolist(), SimpleNamespace(**config.to_dict()), groups, 132,
                         room), lw


@pytest.fixture(scope="module")
def coverage_64():
    """... for 64 sequences (decode attention in one task a (sequence, KV head): no merge groups)."""
    return llama_coverage(max_batch=64, max_tokens_per_step=2560)


@pytest.fixture(scope="module")
def coverage_1():
    """... for one sequence of up to 2,048 tokens (decode attention split over the context, merged by a group)."""
    return llama_coverage(max_batch=1, max_tokens_per_step=2048, max_model_len=2056)


@pytest.mark.parametrize("fixture, merges", [("coverage_64", 0), ("coverage_1", 32)])
def test_gluon_coverage_of_llama3_takes_every_layer_group_but_the_lm_head(fixture, merges, request):
    coverage, lw = request.getfixturevalue(fixture)
    kinds = list(coverage.kinds.values())
    assert (kinds.count(Kind.QKV), kinds.count(Kind.ATTENTION), kinds.count(Kind.LINEAR)) == (32, 32, 96)
    # each layer's attention merge where it has one, idle where the Gluon attention ran
    assert len(coverage.merges) == merges == sum(name.startswith("attention_merge") for name in lw.tasks.event_names)
    names = [lw.tasks.event_names[lw.tasks.tasks[first].signal] for first in coverage.skipped]
    assert names == ["lm_head"] and "bf16 rows" in next(iter(coverage.skipped.values()))


@pytest.mark.parametrize("size, streamk, attention, lm_head", [
    ((2048, 1), False, True, True),  # a prompt's prefill (the LM head: one sequence's last row, the GEMV's)
    ((100, 64), False, True, False),  # prefill chunks beside decoding sequences
    ((40, 2), True, True, False),  # a few prefill tokens: stream-K projections, attention's items
    ((64, 64), True, True, False),  # 64 sequences decoding: 512 (sequence, KV head) pairs fill 132 SMs
    ((16, 16), True, False, False),  # 128 pairs do not: the Triton tasks split the context
    ((1, 1), False, False, True),  # one sequence decoding: the projections' GEMV, QKV's too
])
def test_gluon_coverage_by_step(coverage_64, size, streamk, attention, lm_head):
    coverage, _ = coverage_64
    for first, kind in coverage.kinds.items():  # (every projection in every step)
        assert coverage.applies(first, size) == (attention if kind == Kind.ATTENTION else True), (kind, size)
        assert coverage.takes_streamk(first, size) == (streamk and kind != Kind.ATTENTION), (kind, size)
    assert coverage.applies(next(iter(coverage.skipped)), size) == lm_head


@pytest.mark.parametrize("fixture, size, groups", [
    ("coverage_1", (2048, 1), 6 * 32),  # a prompt: every layer's QKV, attention, its merge, o_proj, gate/up, down
    ("coverage_64", (2048, 1), 5 * 32),  # (no merge groups in this kernel)
    ("coverage_64", (100, 64), 5 * 32),  # prefill chunks beside decoding sequences
    ("coverage_64", (64, 2), 0),  # few prefill tokens: stream-K's projections
    ("coverage_64", (64, 64), 5 * 32),  # a step that only decodes: stream-K's projections (`batch.batch_chain`)
    ("coverage_64", (16, 16), 4),  # ... where attention does not split (a task a pair): o_proj to the next QKV
    ("coverage_1", (1, 1), 6 * 32),  # one row: the GEMV's projections, attention split (`chain.decode_chain`)
    # ... where attention does not split (a task a pair, in this kernel), a layer's o_proj to the next one's QKV
    ("coverage_64", (1, 1), 4),
])
def test_the_persistent_chain_takes_a_steps_layers_whole(fixture, size, groups, request):
    coverage, lw = request.getfixturevalue(fixture)
    run = coverage.chain_groups(size)
    assert len(run) == groups
    # (a one-row step's chain, and a batched decode step's, can be turned off: their steps then launch the groups)
    coverage.one_row_chain = coverage.batch_chain = False
    try:
        assert coverage.chain_groups(size) == [] or size[0] > size[1]
    finally:
        coverage.one_row_chain = coverage.batch_chain = True
    if len(run) >= 5 * 32:  # layer 0's QKV to layer 31's down, every group between them in order
        names = [lw.tasks.event_names[lw.tasks.tasks[first].signal] for first in run]
        assert names[0] == "qkv.0" and names[-1] == "model.layers.31.mlp.down_proj.weight"
    if run:
        assert run == coverage.order[coverage.order.index(run[0]):][:len(run)]


def test_stream_k_takes_llama3s_projections_and_qkv_and_says_why_not(coverage_64):
    coverage, _ = coverage_64
    assert len(coverage.streamk) == 4 * 32 and not coverage.streamk_skipped
    assert tiles.streamk_unsupported(224, 128, 132, (2 * 132 * 64 * 128, 224)) is None  # gate/up's tiles
    assert "scratch holds" in tiles.streamk_unsupported(224, 128, 132, (2 * 132 * 64 * 128 - 1, 224))
    assert "a ticket each" in tiles.streamk_unsupported(225, 128, 132, (1 << 30, 224))
    starved, _ = llama_coverage(max_batch=64, max_tokens_per_step=64)  # no prefill split scratch in this kernel
    assert not starved.streamk and all("scratch holds 0" in why for why in starved.streamk_skipped.values())


@pytest.mark.parametrize("programs, total", [(132, 32 * 64), (132, 224 * 64), (132, 32 * 224), (5, 7), (264, 131)])
def test_stream_k_shares_cover_every_chunk_once_and_name_their_owner(programs, total):
    """`tiles._share` and `_program_of` (pure integer arithmetic: checked here by running them in Python)."""
    share, owner = tiles._share.fn, tiles._program_of.fn
    seen = []
    for p in range(programs):
        c0, c1 = share(p, programs, total)
        seen += range(c0, c1)
        assert all(owner(c, programs, total) == p for c in range(c0, c1))
    assert seen == list(range(total))


@pytest.mark.parametrize("programs, num_tiles, chunks", [(132, 32, 64), (132, 48, 64), (132, 224, 64),
                                                          (132, 32, 224), (7, 3, 5), (16, 40, 1), (264, 2, 3)])
def test_stream_k_finishes_every_tile_once_from_every_chunk_once(programs, num_tiles, chunks):
    """The bookkeeping of `tiles.fragment`, `_slot` and `finish_fragment` played out in Python (the first and the
    last two written again here: they call Gluon's functions): every program's fragments cover each chunk once; a
    tile cut between programs has each fragment's partial in a slot no other fragment of the group takes, its
    contributors are `_program_of` its first and last chunks', and whoever of them arrives last at the ticket reads
    every contributor's slot, each holding this tile's partial."""
    share, owner = tiles._share.fn, tiles._program_of.fn
    total = num_tiles * chunks
    programs = min(programs, total)  # (`streamk_range`: the programs past the chunks take none)
    covered, slots, partials = [], {}, {}

    def slot(p, t):  # (`_slot`)
        return 2 * p + int(share(p, programs, total)[0] <= t * chunks)
    for p in range(programs):
        c, c1 = share(p, programs, total)
        while c < c1:  # (`fragment`)
            t, kc0 = c // chunks, c % chunks
            kc1 = min(chunks, kc0 + (c1 - c))
            covered += [t * chunks + k for k in range(kc0, kc1)]
            if (kc0, kc1) != (0, chunks):  # (`finish_fragment`: a partial)
                assert slot(p, t) not in slots, "two fragments of one group in one slot"
                slots[slot(p, t)] = t
                partials.setdefault(t, []).append(p)
            c += kc1 - kc0
    assert sorted(covered) == list(range(total))
    for t, contributors in partials.items():
        first, last = owner(t * chunks, programs, total), owner((t + 1) * chunks - 1, programs, total)
        assert contributors == list(range(first, last + 1)) and len(contributors) >= 2
        assert all(slots[slot(q, t)] == t for q in contributors)


def test_the_gemv_takes_every_projection_of_llama3_in_a_one_row_step(coverage_1):
    coverage, lw = coverage_1
    assert not coverage.one_row_skipped
    names = [lw.tasks.event_names[lw.tasks.tasks[first].signal] for first in coverage.one_row]
    assert len(names) == 4 * 32 + 1 and names[-1] == "lm_head"
    assert sum(name.startswith("qkv.") for name in names) == 32
    assert [coverage.descriptor(first) for first in coverage.one_row] == list(coverage.one_row.values())


@pytest.mark.parametrize("n, rows, units", [
    (4096, 8, 512),  # o_proj, down: 32-row units would leave one program an SM idle (128 of 264)
    (6144, 8, 768),  # QKV: 16-row units would be 384 for 264 programs, shares of 1 and 2
    (28672, 16, 1792),  # gate/up: shares of 6 and 7
    (128256, 32, 4008),  # the LM head
    (64, 8, 8),  # a tiny model's: fewer units than programs, the one whose shares are most even
])
def test_gemv_units_fill_two_programs_an_sm_evenly(n, rows, units):
    assert gemv.rows_for(n, 132) == rows
    assert gemv.grid(n, rows, 132) == (units, min(units, 264))


def test_the_qkv_gemv_needs_a_heads_scratch_and_tickets():
    values = dict.fromkeys(QKV_FIELDS, 0)
    values.update(x_off=8, k=4096, w_off=16, num_q_heads=32, num_kv_heads=8, head_dim=128, rotary_dim=128,
                  q_out_off=64, step_kv_off=-1, part_off=128, ticket_off=256)
    assert gemv.qkv_unsupported([values[f] for f in QKV_FIELDS]) is None
    assert "tickets" in gemv.qkv_unsupported([{**values, "ticket_off": -1}[f] for f in QKV_FIELDS])
    assert "64 dimensions" in gemv.qkv_unsupported([{**values, "head_dim": 64, "rotary_dim": 64}[f]
                                                    for f in QKV_FIELDS])


def test_the_gemv_takes_bf16_rows_and_the_logits():
    assert gemv.unsupported(words()) is None
    assert gemv.unsupported(words(out_kind=OUT_F32, rows_kind=1)) is None
    assert "router" in gemv.unsupported(words(out_kind=OUT_NARROW))
    assert "routes" in gemv.unsupported(words(route_ticket=100))
    assert "w_off 20" in gemv.unsupported(words(w_off=20))


def test_gluon_coverage_skips_a_merge_group_where_its_attention_ran(coverage_1):
    coverage, _ = coverage_1
    assert all(coverage.applies(merge, (2048, 1)) for merge in coverage.merges)  # a prefill: items of 128 rows
    # one sequence decoding: its 8 (sequence, KV head) pairs' keys in splits (32 in its descriptor) that the last to
    # finish merges
    assert all(coverage.applies(merge, (1, 1)) for merge in coverage.merges)
    attention = [first for first, kind in coverage.kinds.items() if kind == Kind.ATTENTION]
    assert all(coverage.attention_launch(first, (1, 1))[1] for first in attention)
    assert not any(coverage.attention_launch(first, (2048, 1))[1] for first in attention)


def test_attention_splits_a_decode_step_whose_pairs_leave_sms_idle():
    # 16 sequences: 256 // (16 x 8) = 2 splits a pair in the descriptors; 16 x 8 = 128 pairs for 132 SMs
    coverage, _ = llama_coverage(max_batch=16, max_tokens_per_step=640)
    attention = [first for first, kind in coverage.kinds.items() if kind == Kind.ATTENTION]
    assert all(coverage.attention_launch(first, (16, 16))[1] for first in attention)
    assert all(coverage.attention_launch(first, (1, 1))[1] for first in attention)
    assert not any(coverage.attention_launch(first, (40, 16))[1] for first in attention)  # a step that prefills


def test_attention_splits_need_scratch_tickets_and_rows_for_a_kv_heads_queries():
    values = dict.fromkeys(ATTENTION_FIELDS, 0)
    values.update(q_off=128, out_off=64, num_heads=32, num_kv_heads=8, head_dim=128, splits=16, part_off=256,
                  ticket_off=512)
    words = [values[f] for f in ATTENTION_FIELDS]
    assert attention.splits_unsupported(words, 16) is None
    assert "1 splits" in attention.splits_unsupported([{**values, "splits": 1}[f] for f in ATTENTION_FIELDS], 16)
    assert "64 splits" in attention.splits_unsupported([{**values, "splits": 64}[f] for f in ATTENTION_FIELDS], 16)
    assert "tickets" in attention.splits_unsupported([{**values, "ticket_off": -1}[f] for f in ATTENTION_FIELDS], 16)
    assert "4 query heads" in attention.splits_unsupported(words, 2)


def test_the_one_row_loop_takes_a_whole_step_of_llama3(coverage_1, coverage_64):
    """`chain.decode_chain` over steps: its table is a step's plan, then every group of the step in order (the
    embedding, each layer's QKV, attention, o_proj, gate/up and down, the row that needs logits, the LM head, the
    sampler), merges left out; where attention does not split (64 sequences' kernel), it says why not."""
    from codegen.gluon import chain
    coverage, lw = coverage_1
    rows, why = coverage.loop_rows()
    assert why is None
    kinds = [kind for kind, _, _ in rows]
    assert kinds[:2] == [chain.PLAN, chain.EMBED] and kinds[-3:] == [chain.GATHER, chain.LOGITS, chain.SAMPLE]
    assert kinds[2:-3] == [chain.QKV, chain.ATTENTION, chain.PLAIN, chain.GATED, chain.PLAIN] * 32
    sample = [desc for kind, desc, _ in rows if kind == chain.SAMPLE]
    assert sample == [t.desc for t in lw.tasks.tasks if t.kind == Kind.SAMPLE][:1]
    from codegen.lower import sample_wide
    assert coverage.sample_wide == sample_wide(lw) == 4096  # (the sampling cut's scratch, as the lowering made it)
    _, why = coverage_64[0].loop_rows()
    assert "split" in why


@pytest.mark.parametrize("fixture", ["coverage_1", "coverage_64"])
def test_the_batched_loop_takes_a_whole_step_of_llama3(fixture, request):
    """`batch.batch_chain` over steps: the same table with the layers' projections on the stream-K bodies or in
    whole-K tiles (their descriptors the tile bodies') and attention whole or split, so that 64 sequences' kernel
    runs it too."""
    from codegen.gluon import chain
    coverage, _ = request.getfixturevalue(fixture)
    rows, why = coverage.loop_rows(batched=True)
    assert why is None
    kinds = [kind for kind, _, _ in rows]
    assert kinds[:2] == [chain.PLAN, chain.EMBED] and kinds[-3:] == [chain.GATHER, chain.LOGITS, chain.SAMPLE]
    assert kinds[2:-3] == [chain.QKV, chain.ATTENTION, chain.PLAIN, chain.GATED, chain.PLAIN] * 32
    assert [desc for kind, desc, _ in rows if kind == chain.QKV] == \
        [coverage.covered[first] for first in coverage.order if coverage.kinds.get(first) == Kind.QKV]
    # o_proj and down (4,096 weight rows: 128 tiles of 32 for 132 programs) in whole-K tiles, gate/up (28,672: 896
    # tiles, 7 rounds, 3% idle) too, four of a program's at a time; QKV (6,144, no q/k norms) in one round of 128
    # pair tiles
    assert [narrow for _, _, narrow in rows[2:-3]] == [2, 0, 1, 3, 1] * 32
    coverage.batch_pairs = False  # (QKV in two rounds of whole-K tiles: 192 of 32 rows)
    coverage.batch_quads = False  # (gate/up's tiles one at a time)
    try:
        assert [narrow for _, _, narrow in coverage.loop_rows(batched=True)[0][2:-3]] == [1, 0, 1, 1, 1] * 32
    finally:
        coverage.batch_pairs = coverage.batch_quads = True
    # gate/up's quads leave the residual and the norm's sums to the tiles one at a time (a gated projection has
    # neither in the models here)
    gate_up = next(first for first in coverage.order if coverage.kinds.get(first) == Kind.LINEAR and
                   coverage.gated[first])
    coverage.bare[gate_up] = False
    try:
        assert coverage.batch_narrow(gate_up) == 1
    finally:
        coverage.bare[gate_up] = True
    # a pair tile applies the rotary to its own pairs; a q/k norm wants the whole head first (Qwen3's): no pair tiles
    qkv = next(first for first in coverage.order if coverage.kinds.get(first) == Kind.QKV)
    coverage.qk_norm[qkv] = True
    try:
        assert coverage.batch_narrow(qkv) == 1
    finally:
        coverage.qk_norm[qkv] = False
    # ... and a QKV of more rows than 48 x the programs (Phi-4's 7,680: 160 pair tiles) keeps its 32-row tiles
    programs = coverage.programs
    coverage.programs = 6144 // 48 - 1
    try:
        assert coverage.batch_narrow(qkv) == 1
    finally:
        coverage.programs = programs
    # greedy sampling takes the LM head's 1,002 tiles' maxima a row from the stream-K scratch (`batch._maxima`)
    room = coverage.streamk_room
    coverage.streamk_room = (2 * coverage.cfg.max_batch * 1002 - 1, room[1])
    try:
        assert "the LM head's maxima" in coverage.loop_rows(batched=True)[1]
    finally:
        coverage.streamk_room = room


def test_a_stopped_one_row_loop_is_reported_by_its_step_and_group():
    """`HostDriven.run_loop` past its timeout: the first group not every program signalled, from the counters."""
    from codegen.gluon import chain
    from runtime.gluon import loop_hang
    kinds = [chain.PLAN, chain.EMBED, chain.QKV, chain.ATTENTION, chain.SAMPLE]
    counts = [264] * 5 + [264, 264, 100, 0, 0] + [0] * 5
    assert loop_hang(counts, 7, kinds, 264, 300) == \
        "hang: the one-row loop did not end in 300 s: step 8, group 2 (QKV), 100 of 264 programs done"
    assert "every group signalled" in loop_hang([264] * 15, 7, kinds, 264, 300)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe", "llama3-8b"])
def test_the_plans_zeroed_words_are_found_from_the_layout(preset):
    """The Gluon plan (`step.plan_rows`) zeroes what the Triton one does (`lw.constants`' STATS_OFF, STATS_SIZE),
    from the manifest's regions alone (`runtime.megakernel.zeroed_span`)."""
    from blinkc.build import build_graph
    from codegen.config import CompileConfig
    from runtime.megakernel import zeroed_span
    from codegen.lower import lower
    from models.registry import resolve_model
    config = CompileConfig(max_batch=4, max_tokens_per_step=256, max_model_len=512, max_new_tokens=8)
    lw = lower(build_graph(resolve_model(preset), config), config)
    span = zeroed_span(lw.layout.to_dict()["regions"])
    assert span == (lw.constants["STATS_OFF"], lw.constants["STATS_SIZE"])


def constant_resets(source: str) -> list[str]:
    """Names that a function of `source` holds a tensor in (an assignment of anything but a number) and then, inside
    a `for` loop, assigns a Python number: Gluon (Triton 3.6) does not carry such an assignment into the next
    iteration, silently (`k_first = 0` kept a tensor's value and hung the one-row chain: session 65; a `while` loop
    carries it)."""
    import ast

    def number(node) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool))

    def assigned(stmt):
        """(name, whether a number) of each plain assignment in stmt and the statements under it."""
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(target, ast.Name):
                        yield target.id, number(node.value)
                    elif isinstance(target, ast.Tuple):  # (a, b = 0, x: each its own)
                        values = node.value.elts if isinstance(node.value, ast.Tuple) else [None] * len(target.elts)
                        for part, value in zip(target.elts, values):
                            if isinstance(part, ast.Name):
                                yield part.id, value is not None and number(value)

    found = []

    def scan(body, tensors: set[str]) -> None:
        """The statements in order, at every depth, `tensors` the names holding a tensor on the way in."""
        for stmt in body:
            if isinstance(stmt, ast.For):
                found.extend(f"line {stmt.lineno}: {name}" for name, is_number in assigned(stmt)
                             if is_number and name in tensors)
            for block in ("body", "orelse"):
                if isinstance(stmt, (ast.For, ast.While, ast.If)):
                    scan(getattr(stmt, block), set(tensors))
            for name, is_number in assigned(stmt):
                (tensors.discard if is_number else tensors.add)(name)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            scan(node.body, {a.arg for a in node.args.args})
    return found


def test_no_gluon_loop_resets_a_tensor_to_a_number():
    from pathlib import Path

    import codegen.gluon
    assert constant_resets("@gluon.jit\ndef f(n, first):\n    k = first\n    for u in range(n):\n        k = 0\n") \
        == ["line 4: k"]
    assert constant_resets("@gluon.jit\ndef f(n):\n    i = 0\n    for u in range(n):\n        i = g(i)\n") == []
    # (session 64's loader: the tensor set and reset within an outer loop's branch)
    nested = "@gluon.jit\ndef f(n, first):\n    for g in range(n):\n        if g:\n            k = first\n" \
             "            for u in range(n):\n                k = 0\n"
    assert constant_resets(nested) == ["line 6: k"]
    for path in sorted(Path(codegen.gluon.__file__).parent.glob("*.py")):
        assert constant_resets(path.read_text()) == [], path.name


@pytest.mark.parametrize("preset, tokens", [("llama3-8b", 40), ("llama3-8b", 320), ("qwen3-32b", 320)])
def test_a_narrow_groups_rows_box_lies_in_its_region(preset, tokens):
    """`batch._narrow_loads` reads a decode step's rows through a descriptor of min(BM, max_tokens_per_step) rows
    at least, past the step's own (a box past the rows' end cost a narrow group twice its time, session 73): every
    projection's input region (the step's token rows, whatever the batch) holds that many."""
    from blinkc.build import build_graph
    from codegen.bodies.linear import LINEAR_FIELDS
    from codegen.bodies.qkv import QKV_FIELDS
    from codegen.config import CompileConfig
    from codegen.gluon.batch import BM
    from codegen.lower import lower
    from codegen.tasks import Kind
    from models.registry import resolve_model

    config = CompileConfig(max_batch=8, max_tokens_per_step=tokens, max_model_len=512, max_new_tokens=8)
    lw = lower(build_graph(resolve_model(preset), config), config)
    act = [r for r in lw.layout.regions.values() if str(r.arena).endswith("ACT")]
    tasks, descs = lw.tasks.task_table(), lw.tasks.desc_table().tolist()
    firsts = {int(tasks[t, 1]): Kind(int(tasks[t, 0])) for t in range(tasks.shape[0])
              if Kind(int(tasks[t, 0])) in (Kind.LINEAR, Kind.QKV)}
    checked = 0
    for desc, kind in firsts.items():
        f = dict(zip(LINEAR_FIELDS if kind == Kind.LINEAR else QKV_FIELDS, descs[desc]))
        if kind == Kind.LINEAR and f["rows_kind"] == 1:  # (the LM head's rows are the sequences': stream-K, not narrow)
            continue
        region = next(r for r in act if r.offset <= f["x_off"] < r.offset + r.size)
        assert f["x_off"] + min(BM.value, config.max_tokens_per_step) * f["k"] <= region.offset + region.size
        checked += 1
    assert checked >= 4 * resolve_model(preset).config.num_hidden_layers
