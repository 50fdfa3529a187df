"""The Gluon bodies (codegen/gluon) on a loaded kernel: which task groups they take and in which steps
(`GluonCoverage`, from the task and descriptor tables alone), their launches on the kernel's arenas (`GluonGroups`:
group kernels, a step's layers as one persistent launch, and the loops over steps), and the requests run on them,
which is how the runtime runs requests on a Hopper GPU (`runtime.megakernel.Megakernel._gluon`): one request
(`OneRequest`: its prompt through the host-driven executor with the Gluon bodies, its decode steps in the one-row
loop), and a batch (`Batch`: the compiled kernel's steps until every request only decodes, then the batched loop).
"""
from __future__ import annotations

from pathlib import Path

import torch

from codegen.tasks import Kind
from runtime.gluon_kernels import ahead
from runtime.host_driven import HostDriven, contiguous_groups
from runtime.megakernel import Megakernel, use_scratch_allocator
from runtime.sampling import SamplingParams


def loop_hang(counts: list[int], first_step: int, kinds: list[int], programs: int, timeout_s: float,
              which: str = "one-row") -> str:
    """Where a loop (`which`: the one-row or the batched one) stopped, from its counters (an event a group a step,
    `chain.decode_chain`, `batch.batch_chain`): the first group that not every program signalled."""
    from codegen.gluon.chain import KIND_NAMES
    rows = len(kinds)
    late = next((e for e, count in enumerate(counts) if count < programs), None)
    if late is None:
        return f"hang: the {which} loop from step {first_step} did not end in {timeout_s:g} s, every group signalled"
    return (f"hang: the {which} loop did not end in {timeout_s:g} s: step {first_step + late // rows}, group "
            f"{late % rows} ({KIND_NAMES[kinds[late % rows]]}), {counts[late]} of {programs} programs done")


class GluonCoverage:
    """Which task groups the Gluon bodies take (codegen/gluon: `linear.linear_prefill`, `qkv.qkv_prefill`,
    `attention.attention_prefill`, `gemv.linear_gemv`, `gemv.qkv_gemv`), and in which steps, from the task and
    descriptor tables alone: the projections in a step of more tokens than the batched blocks take
    (`CompileConfig.wide_rows`: the Triton tasks then run the prefill tiles), in a step of 2 to 64 rows (the same
    tile bodies, stream-K: a batched decode step), and in a step of one row (batch-1 decode, QKV too; the LM head of a
    step with one sequence); attention in a step where some sequence has more than one token (items of 128 query
    rows), and in a step that only decodes (items of 64 rows, on one consumer warp group): whole where its (sequence,
    KV head) pairs are a wave of `programs` at least, else each pair's keys in splits that the last split to finish
    merges. Attention's outputs are final: the layer's merge group, if it has one, has nothing to do."""

    def __init__(self, tasks: torch.Tensor, descs: list[list[int]], cfg, groups: list[tuple[int, int]],
                 programs: int, streamk_room: tuple[int, int] = (0, 0)) -> None:
        from codegen.bodies.attention import ATTENTION_FIELDS
        from codegen.bodies.linear import LINEAR_FIELDS
        from codegen.bodies.qkv import QKV_FIELDS
        from codegen.gluon import attention, gemv, linear, qkv
        from codegen.gluon.tiles import STREAMK_ROWS

        self.linear, self.qkv, self.attention, self.gemv = linear, qkv, attention, gemv
        self.programs = programs
        self.cfg = cfg
        self.attention_constexprs = {split: attention.constexprs(cfg.page_size, cfg.max_pages_per_seq, cfg.max_batch,
                                                                 split, cfg.block_m)
                                     for split in (False, True)}
        self.norm_f64 = bool(cfg.exact_norm_sums)
        self.gemv_rows = None  # the GEMV's unit height; None: `gemv.rows_for` picks
        self.split_slots = 1  # the one-row chain's attention: a split's slots of keys at least (`attention._splits`)
        # the one-row chain's programs stamp where they are and when each group's event came and their signal went
        # after its counters (`chain._stamp`, `chain._clock`: `benchmarks/explore/chain_probe.py` reads them)
        self.tracing = False
        self.order = [first for first, _ in groups]
        # a one-row step's layers in the chain too (`chain_groups`; False: not; "gemv": its projections' runs only)
        self.one_row_chain: bool | str = True
        self.batch_chain = True  # a batched decode step's layers too (`batch.batch_chain`)
        self.batch_probe = 0  # `batch.batch_chain`'s timing-only PROBE (`benchmarks/explore/chain_probe.py`)
        self.batch_pairs = True  # QKV in pair tiles where it can (`batch_narrow`); False: in NARROW_BN tiles
        self.batch_quads = True  # gate/up's narrow tiles four at a time (`batch_narrow`); False: one at a time
        # the batched loop sampler's passes of logits where a request has a temperature (a greedy step takes the LM
        # head's maxima instead, `batch._greedy`), where the one-row loop's are of 1,024: a b64 step's greedy sampling
        # took 88 us in passes of 1,024 (twice the Triton group's, each program's passes one after another), 81 in 4,096
        self.batch_sample_block = 4096
        self.streamk_room = streamk_room
        self.min_rows = (cfg.wide_m or (32 if cfg.max_batch <= 32 else 64)) + 1  # (`CompileConfig.wide_rows`)
        self.covered: dict[int, int] = {}  # first task of a group -> its descriptor's row
        self.kinds: dict[int, Kind] = {}
        self.merges: dict[int, int] = {}  # the merge group of a covered attention group -> that group
        self.skipped: dict[int, str] = {}  # ... -> why it is left to the Triton tasks
        self.gated: dict[int, bool] = {}
        self.bare: dict[int, bool] = {}
        self.columns: dict[int, int] = {}  # a projection's weight rows; attention: a token's row of the cache
        self.qk_norm: dict[int, bool] = {}  # QKV: whether it has q/k norms (Qwen3's)
        self.kv_heads: dict[int, int] = {}
        self.splits: dict[int, bool] = {}  # attention: whether it can split a decode step's keys
        # a projection the GEMV takes in a step of one row (of the step's tokens or, rows_kind 1, of its sequences'
        # last rows) -> its descriptor's row, and why the others are left to the Triton tasks there
        self.one_row: dict[int, int] = {}
        self.one_row_skipped: dict[int, str] = {}
        self.rows_kind: dict[int, int] = {}
        self.out_kind: dict[int, int] = {}
        # a projection (QKV too) the tile bodies take with STREAM_K in a step of 2 to STREAMK_ROWS rows (streamk_room:
        # the floats and tickets of their scratch), and why the others are left to the Triton tasks there
        self.streamk: set[int] = set()
        self.streamk_rows = STREAMK_ROWS.value
        self.streamk_skipped: dict[int, str] = {}
        self.step_groups: dict[int, tuple[Kind, int]] = {}  # embedding, logits rows, sampling -> (kind, descriptor)
        for i, (first, _) in enumerate(groups):
            kind, desc = Kind(int(tasks[first, 0])), int(tasks[first, 1])
            words = descs[desc]
            if kind == Kind.LINEAR:
                f = dict(zip(LINEAR_FIELDS, words))
                why = linear.unsupported(words[:len(LINEAR_FIELDS)])
                self.gated[first], self.columns[first] = bool(f["gated"]), f["n"]
                self.bare[first] = f["res_off"] < 0 and f["out_stats_off"] < 0  # (no residual, no sums out)
                self.rows_kind[first], self.out_kind[first] = f["rows_kind"], f["out_kind"]
                self._take_one_row(first, desc, gemv.unsupported(words[:len(LINEAR_FIELDS)]))
                if not why:
                    self._take_streamk(first, -(-f["n"] // linear.STREAMK.bn), linear.STREAMK.bn, streamk_room)
            elif kind == Kind.QKV:
                f = dict(zip(QKV_FIELDS, words))
                why = qkv.unsupported(words[:len(QKV_FIELDS)])
                self.columns[first] = (f["num_q_heads"] + 2 * f["num_kv_heads"]) * f["head_dim"]
                self.qk_norm[first] = f["has_qk_norm"] == 1
                self.rows_kind[first] = 0  # (the step's tokens)
                self._take_one_row(first, desc, gemv.qkv_unsupported(words[:len(QKV_FIELDS)]))
                if not why:  # (a tile a head)
                    self._take_streamk(first, f["num_q_heads"] + 2 * f["num_kv_heads"], qkv.STREAMK.bn, streamk_room)
            elif kind in (Kind.EMBED, Kind.GATHER, Kind.SAMPLE):  # (the one-row loop's: `loop_rows`)
                self.step_groups[first] = (kind, desc)
                continue
            elif kind == Kind.ATTENTION:
                f = dict(zip(ATTENTION_FIELDS, words))
                why = attention.unsupported(words[:len(ATTENTION_FIELDS)], cfg.page_size,
                                            bool(cfg.attention_bf16_scores))
                self.columns[first], self.kv_heads[first] = f["num_kv_heads"] * f["head_dim"], f["num_kv_heads"]
                self.splits[first] = not attention.splits_unsupported(words[:len(ATTENTION_FIELDS)], cfg.block_m)
                if f["merger"] == 2:  # (right after its attention group)
                    before = groups[i - 1][0]
                    if not why and self.kinds.get(before) == Kind.ATTENTION:
                        self.merges[first] = before
                    continue
            else:
                continue
            if why:
                self.skipped[first] = why
            else:
                self.covered[first], self.kinds[first] = desc, kind

        vocab = max((descs[desc][1] for kind, desc in self.step_groups.values() if kind == Kind.SAMPLE), default=1)
        self.sample_wide = min(4096, 1 << (vocab - 1).bit_length())  # (`codegen.lower.sample_wide`)
        self.vocab = vocab

    def _take_streamk(self, first: int, tiles: int, bn: int, room: tuple[int, int]) -> None:
        """Group `first` (`tiles` tiles of BN columns) to a stream-K body in steps of few rows, or why not."""
        from codegen.gluon.tiles import streamk_unsupported
        why_not = streamk_unsupported(tiles, bn, self.programs, room)
        if why_not:
            self.streamk_skipped[first] = why_not
        else:
            self.streamk.add(first)

    def _take_one_row(self, first: int, desc: int, why_not: str | None) -> None:
        """Group `first` (descriptor row `desc`) to the GEMV in one-row steps, or why not."""
        if why_not:
            self.one_row_skipped[first] = why_not
        else:
            self.one_row[first] = desc

    def descriptor(self, first: int) -> int:
        """The descriptor row of a group some Gluon body takes in some step."""
        return self.covered[first] if first in self.covered else self.one_row[first]

    def takes_streamk(self, first: int, size: tuple[int, int]) -> bool:
        """Whether a stream-K body takes projection group `first` (QKV's too) in a step of `size` (tokens,
        sequences)."""
        return first in self.streamk and 1 < size[0] <= self.streamk_rows

    def batch_narrow(self, first: int) -> int:
        """How `batch.batch_chain` takes projection group `first` (its table's third column): 1, in whole-K tiles of
        NARROW_BN weight rows, not stream-K (0): a plain projection whose tiles are no more than the programs (a tile
        a program), QKV in two rounds at most (its heads whole in NARROW_BN tiles), or a gated one whose rounds of
        tiles leave the programs idle 5% of the time at most (Llama-3-8B's gate/up: 896 tiles, 7 rounds of 132; at 64
        rows on the H200 the 160 groups took 5,775 us against 6,028 stream-K, its partials' exchange gone, session
        72); 2, QKV without q/k norms in one round of pair tiles (`batch.PAIR_BN` rows a tile, each applying the
        rotary to its own pairs); 3, such a gated one whose programs have tiles to spare, in `batch.QUADS` of them at
        a time (the rows' chunk read once for four tiles' weights, `batch._quad_loads`)."""
        from codegen.gluon.batch import NARROW_BN, PAIR_BN
        tiles = -(-self.columns[first] // NARROW_BN.value)
        if self.kinds.get(first) == Kind.QKV:
            if self.batch_pairs and not self.qk_norm[first] and -(-self.columns[first] // PAIR_BN.value) <= \
                    self.programs:
                return 2
            return int(tiles <= 2 * self.programs and self.attention.HEAD_DIM % NARROW_BN.value == 0)
        if self.kinds.get(first) == Kind.LINEAR and self.gated.get(first):
            if -(-tiles // self.programs) * self.programs > 1.05 * tiles:  # (whole rounds within 5%, or stream-K)
                return 0
            return 3 if self.batch_quads and self.bare[first] and tiles > self.programs else 1
        return int(self.kinds.get(first) == Kind.LINEAR and tiles <= self.programs)

    def batched(self, size: tuple[int, int] | None) -> bool:
        """Whether a step of `size` (tokens, sequences) is one `batch.batch_chain` takes the layers of: a step that
        only decodes, 2 to `streamk_rows` sequences."""
        return size is not None and 1 < size[0] == size[1] <= self.streamk_rows

    def takes_one_row(self, first: int, size: tuple[int, int]) -> bool:
        """Whether the GEMV takes projection group `first` in a step of `size` (tokens, sequences): one row."""
        return first in self.one_row and size[1 if self.rows_kind[first] == 1 else 0] == 1

    def attention_launch(self, first: int, size: tuple[int, int]) -> tuple[dict, bool] | None:
        """The launch options of covered attention group `first` in a step of `size` (tokens, sequences), and whether
        it splits the keys; None where it is the Triton tasks'."""
        tokens, seqs = size
        if tokens > seqs:
            return self.attention.LAUNCH, False
        if seqs * self.kv_heads[first] >= self.programs:
            return self.attention.DECODE_LAUNCH, False
        if self.splits[first]:
            return self.attention.DECODE_LAUNCH, True
        return None

    def chain_groups(self, size: tuple[int, int] | None) -> list[int]:
        """The first tasks of the groups `codegen.gluon.chain` takes in a step of `size` (tokens, sequences): the
        longest run of consecutive groups the prefill bodies take (the projections' tiles, QKV's, attention's items of
        128 rows; a covered attention's merge group within it, as it has nothing to do), in a step that prefills; in
        a step of one row, with `one_row_chain`, the longest run the GEMV and split decode attention take (with
        "gemv", the GEMV alone: a layer's o_proj to the next one's QKV; `chain.decode_chain`); empty in any other step
        or where the run would be a group or none; in a step that only decodes 2 to `streamk_rows` sequences, with
        `batch_chain`, the longest run the stream-K bodies and decode attention take (`batch.batch_chain`)."""
        one_row = size is not None and size == (1, 1)
        batched = self.batched(size)
        if size is None or (not self.one_row_chain if one_row else not self.batch_chain if batched else
                            size[0] <= size[1] or size[0] < self.min_rows):
            return []

        def takes(first: int) -> bool:
            if first in self.merges:
                return takes(self.merges[first])
            kind = self.kinds.get(first, Kind.LINEAR if first in self.one_row else None)
            if kind == Kind.ATTENTION:
                if one_row and self.one_row_chain == "gemv":
                    return False
                launch = self.attention_launch(first, size)
                if batched:
                    return launch is not None
                return launch == ((self.attention.DECODE_LAUNCH, True) if one_row else (self.attention.LAUNCH, False))
            if batched:
                return self.takes_streamk(first, size)
            if one_row:  # (the LM head's row is the sequence's: a group of its own after the layers' run)
                return first in self.one_row and self.rows_kind[first] == 0
            return kind in (Kind.LINEAR, Kind.QKV) and not self.takes_streamk(first, size) \
                and not self.takes_one_row(first, size)

        best: list[int] = []
        run: list[int] = []
        for first in self.order + [None]:
            if first is not None and takes(first):
                run.append(first)
                continue
            if len(run) > len(best):
                best = run
            run = []
        return best if len([f for f in best if f not in self.merges]) > 1 else []

    def loop_rows(self, batched: bool = False) -> tuple[list[tuple[int, int, int]], str | None]:
        """The one-row loop's table (`chain.decode_chain` over steps: a row a group, kind and descriptor row, the
        step's plan first), or with `batched` the batched loop's (`batch.batch_chain` over steps), and why it cannot
        run (None: it can): every group of a step that decodes must be one it takes (the embedding, the layers, the
        rows that need logits, the LM head, and sampling): the one-row loop's projections on the GEMV and attention
        split, the batched loop's on the stream-K bodies and attention whole or split."""
        from codegen.bodies.linear import OUT_F32
        from codegen.gluon import chain
        codes = {Kind.EMBED: chain.EMBED, Kind.GATHER: chain.GATHER, Kind.SAMPLE: chain.SAMPLE}
        rows = [(chain.PLAN, 0, 0)]
        for first in self.order:
            if first in self.merges:
                continue
            if first in self.step_groups:
                kind, desc = self.step_groups[first]
                rows.append((codes[kind], desc, 0))
            elif self.kinds.get(first) == Kind.ATTENTION:
                if not batched and not self.splits[first]:
                    return rows, "its attention does not split a one-row step's keys"
                rows.append((chain.ATTENTION, self.covered[first], 0))
            elif first in self.one_row and self.rows_kind[first] == 1 and self.out_kind[first] == OUT_F32:
                maxima = 2 * self.cfg.max_batch * -(-self.vocab // self.linear.STREAMK.bn)  # (`batch._maxima`)
                if batched and maxima > self.streamk_room[0]:
                    return rows, (f"its stream-K scratch holds {self.streamk_room[0]} floats, the LM head's maxima "
                                  f"for greedy sampling {maxima}")
                rows.append((chain.LOGITS, self.one_row[first], 0))
            elif (first in self.streamk) if batched else (first in self.one_row and self.rows_kind[first] == 0):
                kind = self.kinds.get(first, Kind.LINEAR if first in self.out_kind else Kind.QKV)
                rows.append((chain.QKV if kind == Kind.QKV else chain.GATED if self.gated.get(first) else chain.PLAIN,
                             self.descriptor(first), int(batched and self.batch_narrow(first))))
            else:
                why = (self.streamk_skipped if batched else self.one_row_skipped).get(first) or \
                    self.skipped.get(first) or ("not a stream-K body" if batched else "not a one-row body")
                which = "batched" if batched else "one-row"
                return rows, f"a group (task {first}) the {which} bodies do not take: {why}"
        return rows, None

    def prefill_chain_constexprs(self) -> dict:
        """`chain.prefill_chain`'s constexprs for this kernel."""
        from codegen.gluon import chain
        cfg = self.cfg
        return chain.constexprs(cfg.page_size, cfg.max_pages_per_seq, cfg.max_batch, self.norm_f64)

    def loop_constexprs(self, sampling: bool) -> dict:
        """`chain.decode_chain`'s constexprs for this kernel (with TRACING): units of `gemv_rows` weight rows, 16 if
        None (session 65's H200 figures at context 512 were 3,856 us a step's layers against 3,951 in units of 32 and
        3,887 of 8); the kernel that also samples with temperatures where `sampling`."""
        from codegen.gluon import chain
        cfg = self.cfg
        return {**chain.decode_constexprs(self.gemv_rows or 16, cfg.page_size, cfg.max_pages_per_seq, cfg.max_batch,
                                          self.norm_f64, cfg.block_m, self.split_slots, cfg.max_tokens_per_step,
                                          max_new=cfg.max_new_tokens, sample_wide=self.sample_wide,
                                          sampling=sampling),
                "TRACING": self.tracing}

    def batch_constexprs(self, sampling: bool = False) -> dict:
        """`batch.batch_chain`'s constexprs for this kernel (with TRACING; the loop's: the kernel that also samples
        with temperatures where `sampling`)."""
        from codegen.gluon import batch
        cfg = self.cfg
        return {**batch.constexprs(cfg.page_size, cfg.max_pages_per_seq, cfg.max_batch, self.norm_f64, cfg.block_m,
                                   self.split_slots, cfg.max_tokens_per_step, sample_block=self.batch_sample_block,
                                   max_new=cfg.max_new_tokens, sample_wide=self.sample_wide, sampling=sampling),
                "TRACING": self.tracing, "PROBE": self.batch_probe}

    def gemv_rows_for(self, first: int) -> int:
        """The unit height of one-row projection group `first` on the GEMV."""
        return self.gemv_rows or self.gemv.rows_for(self.columns[first], self.programs)

    def streamk_launch(self, first: int) -> tuple:
        """(kernel, signature, constexprs, launch options) of projection group `first` on the stream-K bodies."""
        linear, qkv = self.linear, self.qkv
        if self.kinds[first] == Kind.QKV:
            return (qkv.qkv_prefill, qkv.SIGNATURE, qkv.constexprs(qkv.STREAMK, self.norm_f64, True),
                    qkv.launch(qkv.STREAMK, True))
        return (linear.linear_prefill, linear.SIGNATURE,
                linear.STREAMK.constexprs(self.gated[first], self.norm_f64, True), linear.STREAMK.launch())

    def one_request_launches(self) -> list[tuple]:
        """(kernel, signature, constexprs, launch options) of each Gluon launch `OneRequest` makes for this kernel: the
        prefill chain, the LM head's GEMV, the loop greedy and sampling, and for a prompt (chunk) of fewer tokens than
        the chain takes, the stream-K projections and attention in items of 128 rows: what `blinkc.build` compiles
        ahead of time (`runtime.gluon_kernels.precompile`)."""
        from codegen.bodies.linear import OUT_F32
        from codegen.gluon import chain
        gemv = self.gemv
        launches = [(chain.prefill_chain, chain.SIGNATURE, self.prefill_chain_constexprs(), chain.LAUNCH)]
        streamk = {}  # (one a distinct launch: the gated projections' and the others', QKV's)
        for first in self.streamk:
            launch = self.streamk_launch(first)
            streamk.setdefault((launch[0], tuple(sorted(launch[2].items()))), launch)
        launches += streamk.values()
        if any(kind == Kind.ATTENTION for kind in self.kinds.values()):
            launches.append((self.attention.attention_prefill, self.attention.SIGNATURE,
                             self.attention_constexprs[False], self.attention.LAUNCH))
        launches += [(gemv.linear_gemv, gemv.SIGNATURE, gemv.constexprs(self.gemv_rows_for(first), self.gated[first],
                                                                          OUT_F32, self.norm_f64), gemv.LAUNCH)
                     for first in self.one_row if self.rows_kind[first] == 1 and self.out_kind[first] == OUT_F32]
        launches += [(chain.decode_chain, chain.DECODE_SIGNATURE, self.loop_constexprs(sampling), chain.DECODE_LAUNCH)
                     for sampling in (False, True)]
        return launches

    def batch_launches(self) -> list[tuple]:
        """(kernel, signature, constexprs, launch options) of the batched loop, greedy and sampling
        (`batch.batch_chain`), which `Batch` launches (and the host-driven executor, a batched decode step's layers
        on the greedy one's): none where its table does not fit this kernel."""
        from codegen.gluon import batch
        if self.loop_rows(batched=True)[1]:
            return []
        return [(batch.batch_chain, batch.BATCH_SIGNATURE, self.batch_constexprs(sampling), batch.LAUNCH)
                for sampling in (False, True)]

    def applies(self, first: int, size: tuple[int, int] | None) -> bool:
        """Whether the group of tasks from `first` is the Gluon bodies' in a step of `size` (tokens, sequences)."""
        if size is None:
            return False
        if first in self.merges:
            return self.attention_launch(self.merges[first], size) is not None
        if self.takes_one_row(first, size) or self.takes_streamk(first, size):
            return True
        kind = self.kinds.get(first)
        if kind == Kind.ATTENTION:
            return self.attention_launch(first, size) is not None
        return kind in (Kind.LINEAR, Kind.QKV) and size[0] >= self.min_rows


class GluonGroups(GluonCoverage):
    """`GluonCoverage` of a loaded kernel, launching the bodies on its arenas, one program an SM."""

    def __init__(self, kernel: Megakernel, groups: list[tuple[int, int]], chain: bool = False) -> None:
        """chain: a prefill step's run of covered groups as one persistent launch (`chain_groups`)."""
        if kernel.device.type != "cuda" or torch.cuda.get_device_capability(kernel.device) != (9, 0):
            raise ValueError("the Gluon bodies are written for Hopper (sm_90): this device cannot run them")
        if kernel.dtype != torch.bfloat16:
            raise ValueError(f"the Gluon bodies take bf16 models, not {kernel.manifest['model']['dtype']}")
        regions = kernel.layout["regions"]
        scratch = [regions.get(name, (None, 0, 0)) for name in ("prefill_parts", "tickets:prefill")]
        room = tuple(size for _, _, size in scratch)
        super().__init__(kernel.tasks.cpu(), kernel.descs.cpu().tolist(), kernel.config, groups,
                         torch.cuda.get_device_properties(kernel.device).multi_processor_count, room)
        self.kernel = kernel
        self.tiles = None  # the projections' tile shape (`linear.Tiles`); None: `linear.tiles_for` picks
        self.control_at, self.positions_at, self.slots_at = (kernel.region(name)[0]
                                                             for name in ("control", "positions", "slots"))
        self.plan_at = tuple(kernel.region(name)[0] for name in ("seq_starts", "context_lens", "seq_req", "req_pages"))
        self.streamk_at = tuple(offset for _, offset, _ in scratch)  # (the stream-K bodies' scratch and tickets)
        self.chain = chain
        self._chains: dict[tuple, tuple[set[int], int, torch.Tensor] | None] = {}  # `_chain_for`'s, by what decides it
        # the host's stop word (`events.stopped`), then the chain's counters (and stamps): grown where a launch needs
        self._events = torch.zeros(1 + len(groups), dtype=torch.int32, device=kernel.device)
        # `launch_loop`'s tables and their kinds on the host, the one-row loop's (False) and the batched one's (True)
        self._loops: dict[bool, tuple[torch.Tensor, list[int]]] = {}
        self._looped = False  # (the last loop launched: batched or not)
        self._stop = torch.ones(1, dtype=torch.int32, pin_memory=True)  # (`stop`'s word, page-locked: copied async)
        self._counts = torch.empty(0, dtype=torch.int32)  # (`prepare_loop`'s)
        from codegen.gluon.step import REGION_NAMES
        from runtime.megakernel import zeroed_span
        self.regions = torch.tensor([kernel.region(name)[0] for name in REGION_NAMES], dtype=torch.int32,
                                    device=kernel.device)  # (`step.py`'s)
        self.zeroed = zeroed_span(regions)  # the F32 words a plan zeroes (offset, size)

    def _chain_for(self, size: tuple[int, int] | None) -> tuple[set[int], int, torch.Tensor] | None:
        """The chain a step of `size` launches, if it launches one: its groups (`chain_groups`), the first of them,
        and its table (a row a group, merges left out: kind, descriptor row, whether its tiles are [128, 128], as
        `linear.tiles_for` picks for the group kernels)."""
        if not self.chain or size is None:
            return None
        key = (size, self.one_row_chain, self.tiles)
        if key not in self._chains:
            from codegen.gluon import chain
            run = self.chain_groups(size)
            codes = {Kind.QKV: chain.QKV, Kind.ATTENTION: chain.ATTENTION}
            # (a group the GEMV takes in one-row steps is a projection's where it is not QKV's)
            kinds = {first: self.kinds.get(first, Kind.LINEAR if first in self.out_kind else Kind.QKV) for first in run}
            prefill, batched = size[0] > size[1], self.batched(size)
            rows = [(codes.get(kinds[first], chain.GATED if self.gated.get(first) else chain.PLAIN),
                     self.descriptor(first),
                     int(prefill and kinds[first] != Kind.ATTENTION and (self.tiles or self.linear.tiles_for(
                         size[0], self.columns[first], self.programs)) == self.linear.NARROW) if not batched else
                     self.batch_narrow(first))
                    for first in run if first not in self.merges]
            table = torch.tensor(rows, dtype=torch.int32).flatten().to(self.kernel.device) if run else None
            self._chains[key] = (set(run), run[0], table) if run else None
        return self._chains[key]

    def _zero_events(self, events: int) -> None:
        """Zeroes the stop word and `events` counters (and the stamps after them where traced), grown if short."""
        from codegen.gluon import chain

        programs = self.gemv.PER_SM * self.programs
        words = 1 + events + (8 * programs + chain.CLOCKS.value * programs * events if self.tracing else 0)
        if self._events.numel() < words:
            self._events = torch.zeros(words, dtype=torch.int32, device=self.kernel.device)
        self._events.zero_()

    def _launch_chain(self, table: torch.Tensor, one_row: bool, steps: int = 1, first_step: int = 0,
                      sampling: bool = False, zeroed: bool = False, batched: bool = False) -> None:
        """The chain of `table`'s groups, its events zeroed first (unless `zeroed`: by `prepare_loop`): a step that
        prefills one program an SM, a batched decode step's too (`batched`: `batch.batch_chain`), steps of one row two
        (`chain.decode_chain`); over `steps` steps from `first_step` where the table plans them (the loops), sampling
        with temperatures where `sampling` (`loop_constexprs`, `batch_constexprs`)."""
        from codegen.gluon import batch, chain
        k = self.kernel
        attention = next(first for first, kind in self.kinds.items() if kind == Kind.ATTENTION)
        rows, programs = table.numel() // chain.ROW, self.gemv.PER_SM * self.programs
        if not zeroed:
            self._zero_events(rows * steps)
        args = (k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, k.kv.numel() // self.columns[attention],
                table, self.counters, rows, self.control_at, self.positions_at, self.slots_at,
                *self.plan_at)
        if batched:
            ahead(batch.batch_chain, batch.BATCH_SIGNATURE)[(self.programs, )](
                *args, *self.streamk_at, steps, first_step, self.regions, *self.zeroed,
                **self.batch_constexprs(sampling), **batch.LAUNCH)
        elif one_row:
            ahead(chain.decode_chain, chain.DECODE_SIGNATURE)[(programs, )](
                *args, steps, first_step, self.regions, *self.zeroed, **self.loop_constexprs(sampling),
                **chain.DECODE_LAUNCH)
        else:
            ahead(chain.prefill_chain, chain.SIGNATURE)[(self.programs, )](
                *args, **self.prefill_chain_constexprs(), **chain.LAUNCH)

    @property
    def counters(self) -> torch.Tensor:
        """The last chain launch's counters (an event a group, a step), then its stamps where it was traced."""
        return self._events[1:]

    def stop(self, stream: torch.cuda.Stream) -> None:
        """Sets the stop word of the chain that runs now, from `stream` (a copy engine writes it while the SMs spin):
        its waits give up and it runs on to its end (`events.wait`)."""
        with torch.cuda.stream(stream):
            self._events[:1].copy_(self._stop, non_blocking=True)

    def loop_kinds(self, batched: bool = False) -> list[int]:
        """The one-row loop's groups' kinds (`loop_rows`), or the batched loop's, its table made on the device the
        first time."""
        if batched not in self._loops:
            rows, why = self.loop_rows(batched)
            if why:
                raise ValueError(f"the {'batched' if batched else 'one-row'} loop cannot run this kernel: {why}")
            self._loops[batched] = (torch.tensor(rows, dtype=torch.int32).flatten().to(self.kernel.device),
                                    [kind for kind, _, _ in rows])
        return self._loops[batched][1]

    def loop_programs(self, batched: bool = False) -> int:
        """A loop's programs: two an SM for the one-row loop, one for the batched one."""
        return self.programs if batched else self.gemv.PER_SM * self.programs

    def prepare_loop(self, steps: int, batched: bool = False) -> None:
        """What a loop of up to `steps` steps needs (batched: `batch.batch_chain`'s), made before anything of the
        host's is launched: its table, the page-locked words its counters are read back into past a timeout (made
        while a kernel runs, they would wait for it to end), and its stop word and counters zeroed, in launch order,
        so that a stop the host sets once an earlier launch is running holds (`launch_loop(prepared=True)`)."""
        rows = len(self.loop_kinds(batched))
        if self._counts.numel() < rows * steps:
            self._counts = torch.empty(rows * steps, dtype=torch.int32, pin_memory=True)
        self._zero_events(rows * steps)

    def launch_loop(self, first_step: int, steps: int, sampling: bool = False, prepared: bool = False,
                    batched: bool = False) -> int:
        """Steps `first_step` .. (at most `steps`) in one launch (`chain.decode_chain` over `loop_rows`' table, steps
        of one row; `batched`: `batch.batch_chain` over the batched table, steps that only decode, of 1 to 64 rows):
        each step planned, run and sampled on the GPU, greedy unless `sampling`, the kernel that also takes
        temperatures, top-k and top-p; the loop stops at a plan that leaves no step it takes. `prepared`:
        `prepare_loop(steps, batched)` came first (else it is done here). Returns the table's rows (the events of step
        s's group g: s rows + g)."""
        if not prepared:
            self.prepare_loop(steps, batched)
        use_scratch_allocator()  # (its loader's tensor descriptors; a step's plan sets it too, but none runs here)
        self._looped = batched
        self._launch_chain(self._loops[batched][0], True, steps, first_step, sampling, zeroed=True, batched=batched)
        return len(self._loops[batched][1])

    def loop_hang(self, first_step: int, steps: int, timeout_s: float, stream: torch.cuda.Stream) -> str:
        """Where the loop launched last from `first_step` (of up to `steps` steps) stopped, from its counters read on
        `stream` (a copy engine reads them while the SMs spin); then sets its stop word (`stop`): its waits give up
        and it runs on to its end."""
        kinds = self._loops[self._looped][1]
        counts = self._counts[:len(kinds) * steps]
        with torch.cuda.stream(stream):
            counts.copy_(self.counters[:len(kinds) * steps], non_blocking=True)
        stream.synchronize()
        self.stop(stream)
        return loop_hang(counts.tolist(), first_step, kinds, self.loop_programs(self._looped), timeout_s,
                         "batched" if self._looped else "one-row")

    def loop_ran(self, first_step: int, step: int) -> bool:
        """Whether step `step` of the last loop (launched from `first_step`) ran: every program signalled its last
        group (a plan that leaves no step the loop takes ends it before the groups)."""
        rows = len(self._loops[self._looped][1])
        return int(self.counters[(step - first_step) * rows + rows - 1]) == self.loop_programs(self._looped)

    def launch(self, first: int, size: tuple[int, int] | None) -> bool:
        """Launches the group of tasks from `first` in a step of `size`, if it is the Gluon bodies' (a merge group
        whose attention group they took: takes it too, launching nothing)."""
        chained = self._chain_for(size)
        if chained and first in chained[0]:
            if first == chained[1]:
                self._launch_chain(chained[2], size == (1, 1), batched=self.batched(size))
            return True  # (the chain's launch ran it)
        if not self.applies(first, size):
            return False
        if first in self.merges:
            return True  # (its attention group's Gluon body left nothing to merge)
        k = self.kernel
        if self.takes_streamk(first, size):
            self._launch_streamk(first)
            return True
        if self.takes_one_row(first, size):
            gemv, n = self.gemv, self.columns[first]
            rows = self.gemv_rows_for(first)
            units, programs = gemv.grid(n, rows, self.programs)
            if first in self.out_kind:  # (a projection's)
                ahead(gemv.linear_gemv, gemv.SIGNATURE)[(programs, )](
                    k.descs, k.weights, k.act, k.f32, self.one_row[first], units,
                    **gemv.constexprs(rows, self.gated[first], self.out_kind[first], self.norm_f64), **gemv.LAUNCH)
            else:  # QKV
                ahead(gemv.qkv_gemv, gemv.QKV_SIGNATURE)[(programs, )](
                    k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, self.one_row[first], units,
                    self.positions_at, self.slots_at, **gemv.qkv_constexprs(rows, self.norm_f64), **gemv.LAUNCH)
            return True
        desc, kind = self.covered[first], self.kinds[first]
        if kind == Kind.ATTENTION:
            options, split = self.attention_launch(first, size)
            ahead(self.attention.attention_prefill, self.attention.SIGNATURE)[(self.programs, )](
                k.descs, k.act, k.f32, k.i32, k.kv, k.kv_plane, k.kv.numel() // self.columns[first], desc,
                self.control_at, *self.plan_at, **self.attention_constexprs[split], **options)
            return True
        linear, tokens = self.linear, size[0]
        tiles = self.tiles or linear.tiles_for(tokens, self.columns[first], self.programs)
        grid = min(self.programs, -(-tokens // linear.BM.value) * -(-self.columns[first] // tiles.bn))
        if kind == Kind.QKV:
            ahead(self.qkv.qkv_prefill, self.qkv.SIGNATURE)[(grid, )](
                k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, desc, self.control_at, self.positions_at,
                self.slots_at, *self.streamk_at, **self.qkv.constexprs(tiles, self.norm_f64), **self.qkv.launch(tiles))
        else:
            ahead(linear.linear_prefill, linear.SIGNATURE)[(grid, )](
                k.descs, k.weights, k.act, k.f32, k.i32, desc, self.control_at, *self.streamk_at,
                **tiles.constexprs(self.gated[first], self.norm_f64), **linear.LAUNCH)
        return True

    def _launch_streamk(self, first: int) -> None:
        """Projection group `first` on the stream-K bodies, a program an SM (the scratch's room is for as many)."""
        k, desc = self.kernel, self.covered[first]
        fn, signature, constexprs, options = self.streamk_launch(first)
        if self.kinds[first] == Kind.QKV:
            ahead(fn, signature)[(self.programs, )](k.descs, k.weights, k.act, k.f32, k.i32, k.kv, k.kv_plane, desc,
                                                    self.control_at, self.positions_at, self.slots_at,
                                                    *self.streamk_at, **constexprs, **options)
        else:
            ahead(fn, signature)[(self.programs, )](k.descs, k.weights, k.act, k.f32, k.i32, desc, self.control_at,
                                                    *self.streamk_at, **constexprs, **options)


class OneRequest:
    """One request on the Gluon kernels, as the runtime runs it on a Hopper GPU (`Megakernel._gluon`): its prompt's
    chunks a step each through the host-driven executor with the Gluon bodies (a step's layers as one persistent
    launch, `chain.prefill_chain`; its LM head the GEMV; its plan, embedding, logits row and sampling the compiled
    kernel's bodies as group kernels, compiled ahead of time: `precompile`), then its decode steps in the one-row loop
    (`GluonGroups.launch_loop`), every launch queued at once: the host waits once, at the end."""

    max_requests = 1

    def __init__(self, kernel: Megakernel, loop: GluonGroups) -> None:
        """loop: the kernel's Gluon groups with `chain` (shared with `Batch`: one launch runs at a time); a ValueError
        where the one-row loop cannot run this kernel, before the host-driven kernels are loaded (or compiled, where
        the cache lacks them)."""
        self.kernel, self.loop = kernel, loop
        self.loop.loop_kinds()
        self.prefill = HostDriven(kernel, gluon=True, chain=True)
        self.side = torch.cuda.Stream(kernel.device)

    def steps(self, prompts: list[list[int]], params: list[SamplingParams], steps: int) -> tuple[list[int], int]:
        """The tokens of each prefill step of a launch of at most `steps` steps (a chunk of the step's token budget
        each, the last sampling the first token), and the loop's steps after them (none for one token)."""
        budget, prompt_len = self.kernel.config.max_tokens_per_step, len(prompts[0])
        chunks = [min(budget, prompt_len - start) for start in range(0, prompt_len, budget)][:steps]
        return chunks, steps - len(chunks) if params[0].max_tokens > 1 else 0

    def launch(self, chunks: list[int], looped: int, sampling: bool) -> list[torch.cuda.Event]:
        """Queues the prefill steps of `chunks` tokens, then `looped` steps of the loop (sampling with temperatures
        where `sampling`); returns an event after each prefill step, for `hang`."""
        if looped:
            self.loop.prepare_loop(looped)  # (before any launch: a stop the host sets holds from then on)
        marks = []
        for step, tokens in enumerate(chunks):
            self.prefill.step(step, (tokens, 1))
            marks.append(torch.cuda.Event())
            marks[-1].record()
        if looped:
            self.loop.launch_loop(len(chunks), looped, sampling, prepared=True)
        return marks

    def hang(self, marks: list[torch.cuda.Event], chunks: list[int], looped: int, timeout_s: float) -> str:
        """Where what `launch` queued stopped, past the timeout; asks it to stop (the chains' waits give up)."""
        for step, mark in enumerate(marks):
            if not mark.query():
                self.prefill.gluon.stop(self.side)
                self.loop.stop(self.side)
                return f"hang: prefill step {step} (the Gluon bodies) did not end in {timeout_s:g} s"
        return self.loop.loop_hang(len(marks), looped, timeout_s, self.side)

    def check_ended(self, state: torch.Tensor, chunks: list[int], looped: int) -> None:
        """A loop ends at the request's end or at its last step; ending at a plan it cannot take (not of one row,
        which one request's decode steps never are) would lose the rest of the request: said, not left incomplete."""
        _check_loop_ended(self.kernel, self.loop, state, len(chunks), looped, "decode loop")


class Batch:
    """Two to `max_requests` (64) requests on the Gluon kernels, as the runtime runs a batch on a Hopper GPU
    (`Megakernel._gluon`): the compiled kernel's steps until every request left only decodes (its planner's chunks
    of the prompts beside the decode rows of the requests whose prompts are in, on the GPU: as many steps as
    `steps_before_decoding` counts on the host), then the steps after them in the batched loop
    (`batch.batch_chain` over steps: each planned, its layers, logits and sampling in one persistent launch), queued
    behind the kernel: the host waits once, at the end. H200, Llama-3-8B at context 512 (session 73, the decode
    benchmark): a step of 64 requests in 6.18-6.35 ms against the compiled kernel's 6.76-6.78, of 8 in 5.12-5.21
    against 5.24-5.27."""

    def __init__(self, kernel: Megakernel, loop: GluonGroups) -> None:
        """loop: as `OneRequest`'s; a ValueError where the batched loop cannot run this kernel."""
        self.kernel, self.loop = kernel, loop
        self.loop.loop_kinds(batched=True)
        self.max_requests = min(kernel.config.max_batch, loop.streamk_rows)  # (a step's rows: the loop's tile's)
        self.side = torch.cuda.Stream(kernel.device)

    def steps(self, prompts: list[list[int]], params: list[SamplingParams], steps: int) -> tuple[int, int]:
        """The compiled kernel's steps of a launch of at most `steps` steps, and the loop's after them: as many as
        the requests can take and the plan that finds them ended (none where all have ended by then)."""
        compiled, decoding = steps_before_decoding([len(p) for p in prompts], [p.max_tokens for p in params],
                                                   self.kernel.config.max_tokens_per_step)
        compiled = min(compiled, steps)
        return compiled, min(steps - compiled, decoding + 1) if decoding else 0

    def launch(self, compiled: int, looped: int, sampling: bool) -> list[torch.cuda.Event]:
        """Queues the compiled kernel's `compiled` steps, then `looped` steps of the batched loop (sampling with
        temperatures where `sampling`); returns an event after the kernel (none where it runs no step), for
        `hang`."""
        if looped:
            self.loop.prepare_loop(looped, batched=True)  # (before any launch: a stop the host sets holds)
        marks = []
        if compiled:
            self.kernel.queue_kernel(compiled)
            marks.append(torch.cuda.Event())
            marks[-1].record()
        if looped:
            self.loop.launch_loop(compiled, looped, sampling, prepared=True, batched=True)
        return marks

    def hang(self, marks: list[torch.cuda.Event], compiled: int, looped: int, timeout_s: float) -> str:
        """Where what `launch` queued stopped, past the timeout; asks it to stop (the kernel's waits and the loop's
        give up)."""
        if marks and not marks[0].query():
            self.loop.stop(self.side)  # (the loop queued behind it: it plans a step, then ends)
            return self.kernel.stop_kernel(marks[0], compiled if looped else None)
        return self.loop.loop_hang(compiled, looped, timeout_s, self.side)

    def check_ended(self, state: torch.Tensor, compiled: int, looped: int) -> None:
        """As `OneRequest.check_ended`: the loop ends at the requests' end or at its last step; ending at a plan it
        cannot take (one that prefills, which `steps_before_decoding` rules out) would lose the rest of the
        requests: said, not left incomplete."""
        _check_loop_ended(self.kernel, self.loop, state, compiled, looped, "batched decode loop")


def _check_loop_ended(kernel: Megakernel, loop: GluonGroups, state: torch.Tensor, first_step: int, looped: int,
                      which: str) -> None:
    """A RuntimeError where the loop launched from `first_step` (`looped` steps) ended at a plan it cannot take with
    requests left: the control words' step (tokens, sequences, done, step) as `state` holds them."""
    if not looped:
        return
    control = kernel.region("control")[0]
    tokens, seqs, done, last = state[control:control + 4].tolist()
    if not done and not loop.loop_ran(first_step, last):
        raise RuntimeError(f"the {which} from step {first_step} stopped at step {last}, a step of {tokens} tokens "
                           f"and {seqs} sequences it cannot take")


def steps_before_decoding(prompt_lens: list[int], max_tokens: list[int], budget: int) -> tuple[int, int]:
    """The steps the kernel's planner (`codegen.bodies.schedule.plan_step`: each unfinished request, in order, takes
    what is left to it of a step's `budget` tokens, up to its prompt's rest or one token) runs before the first in
    which every request left brings one token (its prompt's last or its last sampled one: a step the batched loop
    takes), each request ending at its `max_tokens`; and the steps of one token a request after them, until every
    request has ended (0: all have by then). An EOS ends a request sooner, which leaves the ones after it more of a
    step's budget, never less: their prompts are in no later, so the counts bound the steps of any run of these
    requests. (A budget of `max_batch` tokens at least, `CompileConfig`: a step of one token a request takes them
    all.)"""
    cached, out = [0] * len(prompt_lens), [0] * len(prompt_lens)
    ended = [False] * len(prompt_lens)
    steps = 0
    while True:
        wants = [0 if ended[r] else max(length - cached[r], 1) for r, length in enumerate(prompt_lens)]
        if max(wants) <= 1:
            return steps, max((n - made for n, made, done in zip(max_tokens, out, ended) if not done), default=0)
        left = budget
        for r, want in enumerate(wants):
            take = min(want, left)
            left -= take
            if take:
                cached[r] += take
                if cached[r] >= prompt_lens[r]:  # (the chunk that ends the prompt, or a decode row: it samples)
                    out[r] += 1
                    ended[r] = out[r] >= max_tokens[r]
        steps += 1


def runners(kernel: Megakernel) -> tuple[OneRequest | None, Batch | None, str | None]:
    """The Gluon runners of a loaded kernel (`Megakernel._gluon`): one request's, a batch's (None where the kernel
    takes one request a launch), and why there is no one-request runner (None if there is); a ValueError where the
    Gluon bodies cannot run at all (not Hopper, not bf16)."""
    loop = GluonGroups(kernel, contiguous_groups(kernel.tasks[:, 3].tolist()), chain=True)
    batch = one = why = None
    if kernel.config.max_batch > 1:
        try:
            batch = Batch(kernel, loop)
        except ValueError:  # (a batch runs on the compiled kernel then: MoE, whose experts have no batched body)
            pass
    try:
        one = OneRequest(kernel, loop)
    except ValueError as e:
        why = str(e)
    return one, batch, why


def precompile_runner(which: str, tasks: torch.Tensor, descs: list[list[int]], config: dict, programs: int,
                      room: tuple[int, int]) -> list[Path]:
    """The Gluon kernels runner `which` launches ("one": `OneRequest`, "batch": `Batch`) for a kernel of these task
    and descriptor tables and compile config, on a GPU of `programs` SMs, compiled into Blink's cache ahead of time
    (`gluon_kernels.precompile`; none where the runner cannot run the kernel: the runtime does not make it either).
    `room`: the stream-K scratch's (`GluonGroups`)."""
    from types import SimpleNamespace

    from runtime import gluon_kernels
    coverage = GluonCoverage(tasks, descs, SimpleNamespace(**config), contiguous_groups(tasks[:, 3].tolist()),
                             programs, room)
    if which == "batch":
        launches = coverage.batch_launches() if config["max_batch"] > 1 else []
    else:
        launches = [] if coverage.loop_rows()[1] else coverage.one_request_launches()
    return [gluon_kernels.precompile(*launch) for launch in launches]
