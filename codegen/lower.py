"""Lowering: a graph of fused ops -> memory layout + task graph. One lowering function per op.

Every node becomes one or more groups of tasks tiled over output columns (or heads, sequences, expert
slots); a group waits on the groups that produce its inputs. Activation buffers share regions: the graph is
lowered once with a region each, which shows which groups use each buffer, then again with the regions laid
out so that a buffer only takes the place of one whose every user is done before its writers start
(`shared_activations`; checked by `codegen.check.check_shared_activations`).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from codegen.bodies.attention import ATTENTION_FIELDS
from codegen.bodies.linear import LINEAR_FIELDS, OUT_ALIGNED, OUT_F32, OUT_NARROW
from codegen.bodies.moe import COMBINE_FIELDS, EXPERT_FIELDS, ROUTE_FIELDS
from codegen.bodies.qkv import QKV_FIELDS
from codegen.bodies.rows import ADD_FIELDS, EMBED_FIELDS, GATHER_FIELDS, RMS_NORM_FIELDS
from codegen.bodies.schedule import SAMPLE_FIELDS
from codegen.check import check_shared_activations
from codegen.config import CompileConfig
from codegen.layout import PARK_WORDS, Layout, add_step_regions, aligned
from codegen.tasks import DESC_WORDS, Kind, Prefetch, TaskGraph, Wait
from ir.graph import Graph, Node, Value
from ir.ops.fused import fused_linear_inputs, qkv_rope_store_inputs
from ir.ops.moe import moe_experts_inputs

LONG_DECODE_KEYS = 2048  # keys a decode attention task spans from which its blocks are larger (`decode_block_kv`)


@dataclass
class Lowering:
    graph: Graph
    config: CompileConfig
    layout: Layout = field(default_factory=Layout)
    tasks: TaskGraph = field(default_factory=TaskGraph)
    # value id -> the wait for its producer (or the waits: a MoE output combined in down's tasks at decode)
    ready: dict[int, Wait | tuple[Wait, ...]] = field(default_factory=dict)
    stats: dict[int, int] = field(default_factory=dict)  # value id -> F32 offset of its rows' sum of squares
    linear_descs: dict[int, int] = field(default_factory=dict)  # a projection's output id -> its descriptor
    constants: dict[str, int] = field(default_factory=dict)  # compile-time numbers the template needs
    # F32 region -> (rotary_dim, theta, scaling): each position's cos and sin, [max_model_len, rotary_dim]
    rope_tables: dict[str, tuple] = field(default_factory=dict)
    plan_event: int = -1
    split_linear_event: int = -1  # the last projection group that used the shared `linear_parts` scratch
    prefill_split_event: int = -1  # ... and the last group that may split its prefill tiles' K ranges
    stream_event: int = -1  # ... and the last projection that streams its one-row steps (`stream_parts`)
    sample: Wait | None = None
    # weights placed in a form other than the checkpoint's (see `placed_weight`), in the order to apply them
    transforms: list[dict] = field(default_factory=list)
    # activation buffers (ACT regions): where each goes when they share regions (None: a region each), their
    # sizes, and the nodes (by index in the graph, in order) that use each; the events each node's groups signal
    act_offsets: dict[str, int] | None = None
    act_sizes: dict[str, int] = field(default_factory=dict)
    act_uses: dict[str, list[int]] = field(default_factory=dict)
    node_events: list[range] = field(default_factory=list)
    node_index: int = -1  # the node being lowered

    @cached_property
    def reads(self) -> Counter[int]:
        """How many times each value is an input of a node (a tied weight: more than once)."""
        return Counter(v.id for node in self.graph.nodes for v in node.inputs)

    @cached_property
    def streamed_widths(self) -> frozenset[int]:
        """Output widths of the projections whose one-row steps stream (`gemv_stream`): the `streamable` ones
        where `stream_gemv` is on; where it is -1 (on up to `stream_max_batch`), only if some layer's projection
        is one of them, since the LM head alone does not pay for the body (H200, Qwen3-30B-A3B b1, whose LM head
        is its only such projection: 5.23 ms with it, 5.07 without)."""
        cfg = self.config
        if not cfg.streams_gemv:
            return frozenset()
        logits = self.graph.outputs["logits"].id
        widths = {n.output.id: n.inputs[fused_linear_inputs(n.attrs).index("w")].shape[0]
                  for n in self.graph.nodes if n.op == "fused_linear"}
        streamed = {out: n for out, n in widths.items() if streamable(cfg, n)}
        if cfg.stream_gemv == -1 and not set(streamed) - {logits}:
            return frozenset()
        return frozenset(streamed.values())

    @cached_property
    def attention_outputs(self) -> frozenset[int]:
        """Ids of the values paged attention writes."""
        return frozenset(node.output.id for node in self.graph.nodes if node.op == "paged_attention")

    # -- regions -------------------------------------------------------------------------------------------
    def rows(self, value: Value) -> int:
        return self.config.max_batch if value.shape[0] == "L" else self.config.max_tokens_per_step

    def act(self, value: Value) -> int:
        return self.act_buffer(f"v{value.id}", self.rows(value) * value.shape[1])

    def act_buffer(self, name: str, size: int) -> int:
        """The offset of activation buffer `name` (allocated by its first user: the node that writes it), used
        by the node being lowered."""
        uses = self.act_uses.setdefault(name, [])
        if not uses or uses[-1] != self.node_index:
            uses.append(self.node_index)
        if name not in self.layout.regions:
            self.act_sizes[name] = size
            if self.act_offsets is None:
                self.layout.alloc(name, "ACT", size)
            else:
                self.layout.place(name, "ACT", self.act_offsets[name], size)
        return self.layout.offset(name)

    def weight(self, value: Value) -> int:
        return self.layout.offset(f"param:{value.name}")

    def placed_weight(self, w: Value, *, scale_columns: Value | None = None, interleave_rows: bool = False) -> int:
        """The offset of `w` in the form a body reads: its columns multiplied by a norm weight (the RMSNorm of
        the input folded into the projection, leaving the body a row scale by 1/rms in its epilogue) and/or
        its two halves' rows interleaved (gate row j next to up row j, so that a tile of a gate/up projection
        holds both halves of its outputs and applies SiLU-gating in its epilogue). The runtime transforms the
        weight after loading it, in place unless another op reads the checkpoint's form (a tied embedding)."""
        if scale_columns is None and not interleave_rows:
            return self.weight(w)
        region = f"param:{w.name}"
        if self.reads[w.id] > 1:
            region = f"placed:{w.name}:{scale_columns.name if scale_columns else ''}:{int(interleave_rows)}"
            if region in self.layout.regions:
                return self.layout.offset(region)
            self.layout.alloc(region, "W", self.graph.param(w.name).num_elements)
        elif any(t["region"] == region for t in self.transforms):
            raise ValueError(f"weight {w.name} is transformed twice in place")
        self.transforms.append(dict(region=region, param=w.name,
                                    scale_columns=scale_columns.name if scale_columns else None,
                                    interleave_rows=interleave_rows))
        return self.layout.offset(region)

    def waits(self, *values: Value) -> tuple[Wait, ...]:
        found = []
        for v in values:
            wait = self.ready.get(v.id, ())
            for w in wait if isinstance(wait, tuple) else (wait,):
                if w not in found:
                    found.append(w)
        return tuple(found)

    def pruned(self, waits: tuple[Wait, ...]) -> tuple[Wait, ...]:
        """`waits` without those another of them already implies (a group that waits for an event waits, through
        it, for everything that event's group waited for in the same step)."""
        return tuple(w for w in waits if not any(o != w and self.tasks.follows((o,), w.event) for o in waits))

    def out_stats(self, value: Value) -> int:
        return self.stats.get(value.id, -1)

    def column_tiles(self, width: int) -> int:
        return -(-width // self.config.block_n)

    def may_split_prefill(self, waits: tuple[Wait, ...]) -> bool:
        """Whether a group with these waits may split its prefill tiles' K ranges: the groups that do share
        one parts scratch and one set of tickets, so each must start after the one before is done (the
        caller records the group in `prefill_split_event`)."""
        return "tickets:prefill" in self.layout.regions and (
            self.prefill_split_event < 0 or self.tasks.follows(waits, self.prefill_split_event))


LOWERINGS: dict[str, Callable[[Lowering, Node], None]] = {}


def lowering(op: str):
    def register(fn):
        LOWERINGS[op] = fn
        return fn
    return register


def lower(graph: Graph, config: CompileConfig) -> Lowering:
    unsupported = sorted({n.op for n in graph.nodes} - LOWERINGS.keys())
    if unsupported:
        raise ValueError(f"no lowering for ops {unsupported} (run the LOWERING_PREP passes first)")
    _check_widths(graph)
    lw = _lower(graph, config)
    if config.share_activations:  # the same groups again (lowering is deterministic), on shared regions
        lw = _lower(graph, config, shared_activations(lw))
        regions = {name: (lw.layout.offset(name), size) for name, size in lw.act_sizes.items()}
        check_shared_activations(lw.tasks, regions, lw.act_uses, lw.node_events, _kept(lw))
    return lw


def _lower(graph: Graph, config: CompileConfig, act_offsets: dict[str, int] | None = None) -> Lowering:
    lw = Lowering(graph, config, act_offsets=act_offsets)
    lw.plan_event = lw.tasks.new_event("plan")
    _allocate(lw)
    for index, node in enumerate(graph.nodes):
        lw.node_index, first = index, len(lw.tasks.event_names)
        LOWERINGS[node.op](lw, node)
        lw.node_events.append(range(first, len(lw.tasks.event_names)))
    lw.node_index = len(graph.nodes)
    _add_sampling(lw)
    return lw


def _kept(lw: Lowering) -> set[str]:
    """The activation buffers that live to the end of a step: the graph's outputs."""
    return {f"v{value.id}" for value in lw.graph.outputs.values()}


def shared_activations(lw: Lowering) -> dict[str, int]:
    """Where each activation buffer of a lowering (its first pass: a region each) goes when buffers share
    regions. In graph order, a node's new buffers each take the smallest free region that holds them, freed by
    a buffer whose every user's groups are done, within a step, before any group of the node starts; else a
    region at the end. A buffer is freed after its last user (never where it is a graph output). Across steps
    nothing is shared that is not also ordered: the next step's planner waits on sampling, which every group
    leads to (`codegen.check`). Llama-3-8B, 2,048 tokens a step: ACT 2.02 G elements -> 0.055 G."""
    done_before = lw.tasks.done_before()
    users = [sum(1 << event for event in events) for events in lw.node_events]
    kept = _kept(lw)
    born, dies = defaultdict(list), defaultdict(list)
    for name, uses in lw.act_uses.items():
        born[uses[0]].append(name)
        if name not in kept:
            dies[uses[-1]].append(name)
    free: list[tuple[int, int, int]] = []  # (size, offset, the events of the groups that used it)
    offsets, sizes, end = {}, {}, 0
    for index, events in enumerate(lw.node_events):
        after = -1 if events else 0  # the events every group of the node follows (a node of no groups: none)
        for event in events:
            after &= done_before[event]
        for name in born[index]:
            size = aligned(lw.act_sizes[name])
            fits = [block for block in free if block[0] >= size and (block[2] & ~after) == 0]
            if fits:
                block = min(fits)
                free.remove(block)
                sizes[name], offsets[name] = block[0], block[1]
            else:
                sizes[name], offsets[name] = size, end
                end += size
        for name in dies[index]:
            used = 0
            for user in lw.act_uses[name]:
                used |= users[user] if user < len(users) else 0
            free.append((sizes[name], offsets[name], used))
    return offsets


def _check_widths(graph: Graph) -> None:
    """Bodies promise the compiler that the row widths they stride by are multiples of 8 elements (rows
    16-byte aligned, so loads vectorise): check that promise here."""
    for node in graph.nodes:
        widths = {"embedding": lambda: [node.inputs[1].shape[1]],
                  "gather_rows": lambda: [node.inputs[0].shape[1]],
                  "rms_norm": lambda: [node.inputs[0].shape[1]],
                  "add": lambda: [node.output.shape[1]],
                  "fused_linear": lambda: [node.inputs[0].shape[1], node.inputs[1].shape[1]],
                  "qkv_rope_store": lambda: [node.inputs[0].shape[1], node.attrs["head_dim"]],
                  "paged_attention": lambda: [node.attrs["head_dim"]],
                  "moe_experts": lambda: [node.inputs[0].shape[1], node.inputs[3].shape[1] // 2]}.get(node.op)
        for width in widths() if widths else []:
            if width % 8:
                raise ValueError(f"{node.op}: width {width} is not a multiple of 8 (the megakernel's rows must be "
                                 f"16-byte aligned)")


def _allocate(lw: Lowering) -> None:
    cfg = lw.config
    for p in lw.graph.params:
        lw.layout.alloc(f"param:{p.name}", "W", p.num_elements)
    add_step_regions(lw.layout, T=cfg.max_tokens_per_step, B=cfg.max_batch, R=cfg.max_batch,
                     P=cfg.max_pages_per_seq, M=cfg.max_model_len, O=cfg.max_new_tokens)
    lw.layout.alloc("park", "I32", cfg.target_programs * PARK_WORDS)  # the worker loop's parked state
    # Everything the planner zeroes each step, contiguous: the norms' sums of squares, the split tasks' tickets.
    lw.constants["STATS_OFF"] = lw.layout.sizes["F32"]
    for value in _values_read_by_norms(lw.graph):
        lw.stats[value.id] = lw.layout.alloc(f"stats:v{value.id}", "F32",
                                             lw.rows(value) * (2 if cfg.exact_norm_sums else 1))  # `norm_sums`
    qkv_nodes = [n for n in lw.graph.nodes if n.op == "qkv_rope_store"]
    for node in qkv_nodes:
        lw.layout.alloc(f"tickets:v{node.outputs[0].id}", "F32", _qkv_heads(node))
    attention_nodes = [n for n in lw.graph.nodes if n.op == "paged_attention"]
    for node in attention_nodes:
        lw.layout.alloc(f"tickets:v{node.output.id}", "F32", cfg.max_batch * node.attrs["num_kv_heads"])
    for node in lw.graph.nodes:
        if node.op == "moe_route":  # each expert's count of pairs, then the number of experts with any
            lw.layout.alloc(f"tickets:v{node.outputs[1].id}.counts", "F32", node.inputs[0].shape[1] + 1)
            if cfg.routes_in_router:  # the router's tasks' ticket
                lw.layout.alloc(f"tickets:v{node.outputs[1].id}.router", "F32", 1)
        if node.op == "moe_experts" and cfg.expert_claims:  # a claim counter a column block: gate/up's, down's
            gate_up = dict(zip(moe_experts_inputs(node.attrs), node.inputs))["gate_up"]
            lw.layout.alloc(f"tickets:moe.v{node.output.id}.claims", "F32",
                            sum(_expert_tiles(cfg, n) for n in gate_up.shape[1:]))
        if node.op == "moe_experts" and cfg.combines_in_down:  # a ticket a column tile of down's
            lw.layout.alloc(f"tickets:moe.v{node.output.id}.combine", "F32", _expert_tiles(cfg, node.output.shape[1]))
    lw.layout.alloc("tickets:sample", "F32", cfg.max_batch)
    linears = [(n.output, n.inputs[fused_linear_inputs(n.attrs).index("w")].shape[0])  # (output, its width)
               for n in lw.graph.nodes if n.op == "fused_linear"]
    split_linears = [(out, n) for out, n in linears if linear_splits(cfg, n) > 1]
    for out, n in split_linears:
        lw.layout.alloc(f"tickets:v{out.id}", "F32", n // cfg.batch_n)
    # prefill steps whose tiles are too few split their K ranges: one scratch of target_programs parts and
    # one set of tickets for every group (each starts after the one before; the last split of a tile zeroes
    # its ticket for the next group)
    if max(cfg.max_tokens_per_step, cfg.max_batch) > cfg.wide_rows:
        lw.layout.alloc("tickets:prefill", "F32", cfg.target_programs)
        lw.constants["PREFILL_PARTS"] = cfg.target_programs
    # the projections that stream their one-row steps: a ticket a part, two [block_n] partials a part and the
    # fp32 results of the whole tiles (one set for every such group: each starts after the one before; the
    # last to arrive at a ticket zeroes it again)
    streamed = [n for _, n in linears if n in lw.streamed_widths]
    if streamed:
        lw.layout.alloc("tickets:stream", "F32", cfg.target_programs)
    lw.constants["STATS_SIZE"] = lw.layout.sizes["F32"] - lw.constants["STATS_OFF"]
    if streamed:
        lw.layout.alloc("stream_parts", "F32", cfg.target_programs * 2 * cfg.block_n)
        lw.layout.alloc("stream_out", "F32", -(-max(streamed) // cfg.block_n) * cfg.block_n)
    lw.layout.alloc("sample_parts", "F32", cfg.max_batch * sample_splits(lw) * 2)
    if attention_nodes:  # one scratch for every layer, as for the QKV parts
        head_dim = _pow2(max(16, max(n.attrs["head_dim"] for n in attention_nodes)))
        lw.layout.alloc("attention_parts", "F32", cfg.max_batch * max(
            n.attrs["num_kv_heads"] * attention_splits(cfg, n.attrs["num_kv_heads"]) for n in attention_nodes)
            * cfg.block_m * (head_dim + 2))
    if split_linears:  # one scratch for every split projection: each starts after the previous is done
        lw.layout.alloc("linear_parts", "F32", max(n * linear_splits(cfg, n) for _, n in split_linears)
                        * cfg.wide_rows)
    if "PREFILL_PARTS" in lw.constants:
        lw.layout.alloc("prefill_parts", "F32", lw.constants["PREFILL_PARTS"] * cfg.prefill_rows * cfg.wide_n)
    if qkv_nodes:  # one scratch for every layer: layer l + 1's QKV starts after layer l's is done
        head_dim = _pow2(max(16, max(n.attrs["head_dim"] for n in qkv_nodes)))
        lw.layout.alloc("qkv_parts", "F32", max(_qkv_heads(n) * qkv_splits(lw, n) for n in qkv_nodes)
                        * max(cfg.block_m, cfg.qkv_block_m) * head_dim)


def _pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def _qkv_heads(node: Node) -> int:
    return (node.attrs["q_size"] + 2 * node.attrs["kv_size"]) // node.attrs["head_dim"]


def sample_splits(lw: Lowering) -> int:
    """Tasks per sequence for greedy sampling: about 8192 logits each."""
    vocab = lw.graph.outputs["logits"].shape[1]
    return lw.config.sample_splits or max(1, min(32, -(-vocab // 8192)))


def sample_wide(lw: Lowering) -> int:
    """Logits per block of the passes a sampling cut takes over the whole row (and the scratch a sequence's
    top-k select copies its last candidates to)."""
    return min(4096, 1 << (lw.graph.outputs["logits"].shape[1] - 1).bit_length())


def attention_splits(config: CompileConfig, num_kv_heads: int) -> int:
    """Tasks per (sequence, KV head) at decode: enough for about 256 tasks per layer at full batch (a
    decode step's attention is latency, not bandwidth: short tasks side by side), each at least a key block,
    and at most 32. (H100, Llama-3-8B b1 at 4096 tokens of context, 32 / 16 splits: 6.80 / 6.87 ms with the
    merge group, 7.13 / 6.98 with the last split merging.)"""
    if config.attention_splits:
        return config.attention_splits
    return max(1, min(32, 256 // (config.max_batch * num_kv_heads), config.max_model_len // config.block_kv))


def decode_block_kv(config: CompileConfig, num_kv_heads: int) -> int:
    """Keys per block of a decoding sequence's attention: `decode_block_kv` if set; else 64 (block_kv if larger)
    where a decode task spans at least LONG_DECODE_KEYS keys of the compiled context, block_kv elsewhere. A long
    task streams better in fewer, larger blocks; a short one does not gain, and at batch 64 the larger blocks'
    registers cost the other bodies (spills 74 -> 100 B). H200, Llama-3-8B TPOT ms at 32 / 64 keys a block (one
    kernel compiled for each context): b64 ctx512 7.39 / 7.51, ctx1024 8.59 / 8.52, ctx2048 10.92 / 10.51, ctx4096
    15.51 / 14.44; b32 ctx512 5.82 / 5.82, ctx4096 9.93 / 9.34; b16 ctx4096 7.64 / 7.44; b8 ctx4096 6.32 / 6.32;
    b1 ctx512 4.68 / 4.74, ctx4096 4.93 / 4.91. Alone (`benchmarks/explore/decode_attention.py`, 264 programs, b64):
    ctx513 47.1 / 44.0 us, ctx4097 303 / 253 us (84% / 101% of the read bandwidth)."""
    if config.decode_block_kv:
        return config.decode_block_kv
    keys_per_task = config.max_model_len // attention_splits(config, num_kv_heads)
    return max(config.block_kv, 64) if keys_per_task >= LONG_DECODE_KEYS else config.block_kv


def linear_splits(config: CompileConfig, n: int) -> int:
    """Tasks per block of batch_n output columns when a step has more than rows_max rows (batched decode): the
    fewest splits of each block's K range (powers of two, up to batch_n // block_n) that give the group a task
    for every program, so that a group of many blocks (gate/up, an LM head) owns them whole and sums no
    partials; 1 where the blocks do not divide the columns, or where no step takes them (`wide_rows` rows at
    most rows_max). `batch_splits` sets it for every group whose blocks divide. H200, Llama-3-8B b64 ctx512,
    gate/up's 448 blocks at 1 / 2 / 4 splits: 72 / 87 / 92-96 us a layer (`profile_step`; o_proj's and down's 64
    blocks keep 4: at 1, 30 and 77 us against 22 and 46)."""
    most = config.batch_n // config.block_n
    if config.wide_rows <= config.rows_max or most <= 1 or n % config.batch_n:
        return 1
    if config.batch_splits:
        return min(config.batch_splits, most)
    splits = 1
    while splits < most and n // config.batch_n * splits < config.target_programs:
        splits *= 2
    return splits


def launch_programs(config: CompileConfig) -> int:
    """The most programs a launch runs (the interpreter runs one)."""
    return 1 if config.interpret else config.target_programs


def streamable(config: CompileConfig, n: int) -> bool:
    """Whether a projection of `n` outputs streams its one-row steps (`gemv_stream`): where it has at least
    `stream_waves` tiles for every program the launch may run (each program then has a unit of work). With
    about one tile a program, nearly every tile is shared by two parts, and the ticket and second epilogue at
    each end cost more than the balance gains: H200, Llama-3-8B b1, o_proj 18.9 / 11.7 us a layer streamed /
    not, down 39.7 / 32.0, while gate/up (7 tiles a program) 62.8 / 67.7 and the LM head 247.9 / 267.2."""
    tiles = -(-n // config.block_n)
    return config.streams_gemv and not config.dynamic_tasks and tiles >= config.stream_waves * launch_programs(config)


def stream_range(config: CompileConfig, n: int, k: int, itemsize: int, part: int, parts: int) -> tuple[int, int]:
    """The units (a tile's [block_n, stream_block_k] chunk, tile by tile) that part `part` of `parts` streams of a
    projection of `n` outputs and `k` inputs, as `gemv_stream` cuts them: an even share, or whole tiles where the
    parts of the most tiles stream at most `stream_whole_kb` past an even share."""
    chunks = -(-k // config.stream_block_k)
    tiles = -(-n // config.block_n)
    past = (-(-tiles // parts) * parts - tiles) * chunks * config.block_n * config.stream_block_k * itemsize
    if config.stream_whole_kb and past <= config.stream_whole_kb * 1024 * parts and parts <= tiles:
        return part * tiles // parts * chunks, (part + 1) * tiles // parts * chunks
    return part * tiles * chunks // parts, (part + 1) * tiles * chunks // parts


def _stream_prefetch(lw: Lowering, w_off: int, n: int, k: int, itemsize: int, kb: int, parts: int):
    """The prefetch of a streamed group's task `part`: the first `kb` KB of its part's range, where a launch on
    `parts` programs starts it (the same rows serve the group's steps of more rows: they are its weights)."""
    bn, bk = lw.config.block_n, lw.config.stream_block_k
    chunks = -(-k // bk)

    def prefetch(part: int) -> Prefetch:
        if part >= parts:
            return Prefetch()
        tile, chunk = divmod(stream_range(lw.config, n, k, itemsize, part, parts)[0], chunks)
        lo = chunk * bk
        return _prefetch_rows(lw, w_off + tile * bn * k + lo, k, min(bn, n - tile * bn), k - lo, itemsize, kb)
    return prefetch


def even_chunks(lw: Lowering, chunk: int) -> bool:
    """Whether every projection's and QKV's input width is a multiple of `chunk` (a power of two): then so is
    every K range a task of theirs takes in chunks of `chunk` or less (`EVEN_K` in codegen/bodies/linear.py)."""
    return all(node.inputs[0].shape[1] % chunk == 0 for node in lw.graph.nodes
               if node.op in ("fused_linear", "qkv_rope_store"))


def even_columns(lw: Lowering, width: int) -> bool:
    """Whether every projection's output width is a multiple of `width` (a power of two): then so is every
    column tile of `width` or fewer columns whole (`EVEN_N` in codegen/bodies/linear.py)."""
    return all(n.inputs[fused_linear_inputs(n.attrs).index("w")].shape[0] % width == 0
               for n in lw.graph.nodes if n.op == "fused_linear")


def even_heads(lw: Lowering, width: int) -> bool:
    """Whether every QKV head's dimensions fill `width` (the padded head dimension) exactly: then no head's
    tile reaches past its own rows (`EVEN_D` in codegen/bodies/qkv.py)."""
    return all(n.attrs["head_dim"] == width for n in lw.graph.nodes if n.op == "qkv_rope_store")


def qkv_block_k(lw: Lowering) -> int:
    """The QKV body's K chunk (codegen/render.py passes the same)."""
    return min(lw.config.block_k, 64)


def _prefetch_rows(lw: Lowering, offset: int, stride: int, rows: int, row_elems: int, itemsize: int,
                   kb: int | None = None) -> Prefetch:
    """The first `kb` (default `prefetch_kb`) KB of `rows` weight rows of `row_elems` elements, `stride`
    elements apart."""
    if rows <= 0 or row_elems <= 0:
        return Prefetch()
    kb = lw.config.prefetch_kb if kb is None else kb
    row_bytes = min(row_elems * itemsize, max(16, (kb << 10) // rows)) // 16 * 16
    return Prefetch(offset, stride * itemsize, rows, row_bytes) if row_bytes else Prefetch()


def qkv_splits(lw: Lowering, node: Node) -> int:
    """Tasks per head at decode: the heads' K ranges split so that the layer's QKV is about one wave of the
    expected programs (measured on the H100, Llama-3-8B: 5 splits of 48 heads beat 8 splits of 128 KB, which
    left a second wave for 120 of 264 programs), each split at least one K chunk."""
    if lw.config.qkv_splits:
        return lw.config.qkv_splits
    return max(1, min(lw.config.target_programs // _qkv_heads(node), node.inputs[0].shape[1] // qkv_block_k(lw)))


def _values_read_by_norms(graph: Graph) -> list[Value]:
    found: dict[int, Value] = {}
    for node in graph.nodes:
        reads_norm = (node.op == "rms_norm" and node.attrs["group"] == node.output.shape[1]) or \
            (node.op == "fused_linear" and node.attrs["prologue"] == "rms_norm") or \
            (node.op == "qkv_rope_store" and node.attrs["has_norm"]) or \
            (node.op == "moe_experts" and node.attrs["prologue"] == "rms_norm")
        if reads_norm:
            found.setdefault(node.inputs[0].id, node.inputs[0])
    return list(found.values())


def _rows_kind(value: Value) -> int:
    return 1 if value.shape[0] == "L" else 0


@lowering("embedding")
def _embedding(lw: Lowering, node: Node) -> None:
    _, table = node.inputs
    out = node.output
    desc = lw.tasks.add_desc(EMBED_FIELDS, dict(table_off=lw.weight(table), hidden=out.shape[1],
                                                out_off=lw.act(out), out_stats_off=lw.out_stats(out)))
    lw.ready[out.id] = lw.tasks.add_group(Kind.EMBED, desc, lw.column_tiles(out.shape[1]), "embedding", ())


@lowering("gather_rows")
def _gather_rows(lw: Lowering, node: Node) -> None:
    x, _ = node.inputs
    out = node.output
    desc = lw.tasks.add_desc(GATHER_FIELDS, dict(x_off=lw.act(x), hidden=out.shape[1], out_off=lw.act(out),
                                                 out_stats_off=lw.out_stats(out)))
    lw.ready[out.id] = lw.tasks.add_group(Kind.GATHER, desc, lw.column_tiles(out.shape[1]), "gather_rows",
                                          lw.waits(x))


@lowering("rms_norm")
def _rms_norm(lw: Lowering, node: Node) -> None:
    x, w = node.inputs
    out = node.output
    if node.attrs["group"] != x.shape[1]:
        raise ValueError("a grouped rms_norm outside a qkv_rope_store has no lowering")
    desc = lw.tasks.add_desc(RMS_NORM_FIELDS, dict(
        x_off=lw.act(x), hidden=x.shape[1], stats_off=lw.stats[x.id], norm_w_off=lw.weight(w),
        eps=float(node.attrs["eps"]), out_off=lw.act(out), rows_kind=_rows_kind(x)))
    lw.ready[out.id] = lw.tasks.add_group(Kind.RMS_NORM, desc, lw.column_tiles(x.shape[1]), "rms_norm", lw.waits(x))


@lowering("add")
def _add(lw: Lowering, node: Node) -> None:
    a, b = node.inputs
    out = node.output
    desc = lw.tasks.add_desc(ADD_FIELDS, dict(a_off=lw.act(a), b_off=lw.act(b), hidden=out.shape[1],
                                              out_off=lw.act(out), out_stats_off=lw.out_stats(out),
                                              rows_kind=_rows_kind(out)))
    lw.ready[out.id] = lw.tasks.add_group(Kind.ADD, desc, lw.column_tiles(out.shape[1]), "add", lw.waits(a, b))


@lowering("fused_linear")
def _fused_linear(lw: Lowering, node: Node) -> None:
    named = dict(zip(fused_linear_inputs(node.attrs), node.inputs))
    x, w, out = named["x"], named["w"], node.output
    is_f32 = out.id == lw.graph.outputs["logits"].id  # the LM head writes fp32 logits to the F32 arena
    if is_f32:
        out_off = lw.layout.alloc(f"v{out.id}", "F32", lw.rows(out) * out.shape[1])
        lw.constants["LOGITS_OFF"] = out_off
    else:
        out_off = lw.act(out)
    residual, gated = named.get("residual"), node.attrs["gated"]
    w_off = lw.placed_weight(w, scale_columns=named.get("norm_w"), interleave_rows=gated)
    splits = linear_splits(lw.config, w.shape[0])
    waits = lw.waits(x, *([residual] if residual is not None else []))
    split_prefill = lw.may_split_prefill(waits)
    n, k = w.shape
    tiles = lw.column_tiles(n)
    # a streamed group shares one scratch with the others: it must start after the one before is done
    streams = n in lw.streamed_widths and (lw.stream_event < 0 or lw.tasks.follows(waits, lw.stream_event))
    num_tasks = tiles if streams else _prefill_tasks(lw.config, n, k, tiles)
    if num_tasks > tiles:
        lw.constants["PREFILL_ONLY_LINEARS"] = 1
    desc = lw.tasks.add_desc(LINEAR_FIELDS, dict(
        x_off=lw.act(x), x_stride=x.shape[1], k=w.shape[1], w_off=w_off, n=w.shape[0], out_off=out_off,
        out_stride=out.shape[1], gated=int(gated),
        out_kind=OUT_F32 if is_f32 else OUT_ALIGNED if out.shape[1] % 8 == 0 else OUT_NARROW,
        stats_off=lw.stats.get(x.id, -1) if node.attrs["prologue"] == "rms_norm" else -1,
        eps=float(node.attrs["eps"]), res_off=lw.act(residual) if residual is not None else -1,
        res_stride=out.shape[1],
        bias_off=lw.placed_weight(named["bias"], interleave_rows=gated) if "bias" in named else -1,
        out_stats_off=lw.out_stats(out), rows_kind=_rows_kind(x), splits=splits,
        part_off=lw.layout.offset("linear_parts") if splits > 1 else -1,
        ticket_off=lw.layout.offset(f"tickets:v{out.id}") if splits > 1 else -1,
        prefill_part_off=lw.layout.offset("prefill_parts") if split_prefill else -1,
        prefill_ticket_off=lw.layout.offset("tickets:prefill") if split_prefill else -1, prefill_tasks=num_tasks,
        route_rel=0, route_ticket=-1))  # (set by `_moe_route` for a router that routes: `router_routes`)
    lw.linear_descs[out.id] = desc
    name = "lm_head" if is_f32 else w.name
    if splits > 1 and lw.split_linear_event >= 0 and not lw.tasks.follows(waits, lw.split_linear_event):
        raise ValueError(f"{name} may run beside {lw.tasks.event_names[lw.split_linear_event]}: they would share "
                         f"the split projections' scratch")
    # The prefetch is batch 1's (a task's BN weight rows, or its part's first where the group streams); a
    # batched step's split of a wider block reads weights that a neighbouring task of the same group asked for.
    bn = lw.config.block_n
    kb = lw.config.prefetch_attention_kb if x.id in lw.attention_outputs else lw.config.prefetch_kb
    if streams:  # a task a program at least, those past the tiles only for the streamed steps
        num_tasks = max(tiles, launch_programs(lw.config))
        prefetch = _stream_prefetch(lw, w_off, n, k, w.dtype.itemsize, kb, min(num_tasks, lw.config.target_programs))
    else:  # (the prefill-only tasks prefetch nothing: their tiles are their prefill step's choice)
        prefetch = lambda tile: _prefetch_rows(lw, w_off + tile * bn * k, k, min(bn, n - tile * bn), k,  # noqa: E731
                                               w.dtype.itemsize, kb) if tile < tiles else Prefetch()
    done = lw.tasks.add_group(Kind.LINEAR, desc, num_tasks, name, waits, prefetch, streams=streams,
                              stream_only_from=tiles if streams and num_tasks > tiles else None,
                              prefill_only_from=tiles if not streams and num_tasks > tiles else None)
    if streams:
        lw.stream_event = done.event
    if splits > 1:
        lw.split_linear_event = done.event
    if split_prefill:
        lw.prefill_split_event = done.event
    lw.ready[out.id] = done


def _prefill_tasks(cfg: CompileConfig, n: int, k: int, tiles: int) -> int:
    """A projection's tasks: a column tile's each in decode steps, the prefill tiles shared among them all
    (`linear_task`). Where the tiles are fewer than half the programs (a router's logits; o_proj of a model 2,048
    wide, 128 tasks) and the kernel prefills, a prefill step gets tasks past them, up to a program each for its
    tiles and their K splits, which the other steps skip."""
    if (not cfg.narrow_prefill_tasks or max(cfg.max_tokens_per_step, cfg.max_batch) <= cfg.wide_rows
            or 2 * tiles > cfg.target_programs):
        return tiles
    splits = max(1, k // (8 * (cfg.prefill_block_k or cfg.block_k_dot)))  # `prefill_splits`' most
    items = -(-cfg.max_tokens_per_step // cfg.prefill_rows) * -(-n // cfg.wide_n) * splits
    return max(tiles, min(cfg.target_programs, items))


@lowering("qkv_rope_store")
def _qkv_rope_store(lw: Lowering, node: Node) -> None:
    a = node.attrs
    named = dict(zip(qkv_rope_store_inputs(a), node.inputs))
    x, w, cache = named["x"], named["w"], named["cache"]
    q, new_cache = node.outputs
    head_dim = a["head_dim"]
    rope_key = f"rope:{a['rotary_dim']}:{a['theta']}:{sorted((a['scaling'] or {}).items())}"
    if rope_key not in lw.layout.regions:
        lw.layout.alloc(rope_key, "F32", lw.config.max_model_len * a["rotary_dim"])
        lw.rope_tables[rope_key] = (a["rotary_dim"], a["theta"], a["scaling"])
    layer = int(cache.name.rsplit(".", 1)[1])
    k, splits = x.shape[1], qkv_splits(lw, node)
    # a decode step's tasks are (head, split); a prefill step's (head, row block) tiles are shared by every task
    # of the group, so it has one a program: those past the decode ones only prefill (Llama-3-8B: 240 decode
    # tasks, and a 2,048-token prompt's 1,536 tiles were 7 to some task where 264 tasks take 6 at most)
    decode_tasks = _qkv_heads(node) * splits
    num_tasks = max(decode_tasks, launch_programs(lw.config))
    w_off = lw.placed_weight(w, scale_columns=named.get("norm_w"))
    desc = lw.tasks.add_desc(QKV_FIELDS, dict(
        x_off=lw.act(x), k=x.shape[1], w_off=w_off, num_q_heads=a["q_size"] // head_dim,
        num_kv_heads=a["kv_size"] // head_dim, head_dim=head_dim, rotary_dim=a["rotary_dim"],
        stats_off=lw.stats.get(x.id, -1) if a["has_norm"] else -1, eps=float(a["eps"]),
        bias_off=lw.weight(named["bias"]) if a["has_bias"] else -1,
        q_norm_off=lw.weight(named["q_norm_w"]) if a["has_qk_norm"] else -1,
        k_norm_off=lw.weight(named["k_norm_w"]) if a["has_qk_norm"] else -1, qk_eps=float(a["qk_eps"]),
        q_out_off=lw.act(q), layer=layer, rope_off=lw.layout.offset(rope_key),
        has_qk_norm=int(a["has_qk_norm"]), splits=splits,
        part_off=lw.layout.offset("qkv_parts"), ticket_off=lw.layout.offset(f"tickets:v{q.id}"),
        num_tasks=num_tasks, step_kv_off=step_kv(lw)))
    chunk = -(-(-(-k // splits)) // qkv_block_k(lw)) * qkv_block_k(lw)  # as the body splits K

    def prefetch(tile: int) -> Prefetch:
        if tile >= decode_tasks:
            return Prefetch()
        head, split = divmod(tile, splits)
        lo = min(k, split * chunk)
        return _prefetch_rows(lw, w_off + head * head_dim * k + lo, k, head_dim, min(k, lo + chunk) - lo,
                              w.dtype.itemsize)

    done = lw.tasks.add_group(Kind.QKV, desc, num_tasks, f"qkv.{layer}", lw.waits(x), prefetch,
                              prefill_only_from=decode_tasks if num_tasks > decode_tasks else None)
    lw.ready[q.id] = lw.ready[new_cache.id] = done
    lw.constants["HEAD_DIM_MAX"] = max(lw.constants.get("HEAD_DIM_MAX", 0), head_dim)
    lw.constants["PARTIAL_ROTARY"] = lw.constants.get("PARTIAL_ROTARY", 0) | int(a["rotary_dim"] != head_dim)


@lowering("paged_attention")
def _paged_attention(lw: Lowering, node: Node) -> None:
    q, cache = node.inputs[0], node.inputs[1]
    a = node.attrs
    layer = int(cache.name.rsplit(".", 1)[1]) if cache.name else _layer_of(lw, cache)
    splits = attention_splits(lw.config, a["num_kv_heads"])
    lw.constants["ATTENTION_SPLITS_MAX"] = max(lw.constants.get("ATTENTION_SPLITS_MAX", 1), splits)
    lw.constants["DECODE_BLOCK_KV"] = max(lw.constants.get("DECODE_BLOCK_KV", 0),
                                          decode_block_kv(lw.config, a["num_kv_heads"]))
    # a decode step's tasks are (sequence, KV head, split); a prefill step's blocks are shared by every task of
    # the group, so it has at least one a program: the tasks past the decode ones only prefill (batch 1 has
    # 128 decode tasks; a 512-token prompt's 256 blocks then ran two to a task on half the programs), and in
    # a step that only decodes they signal without waiting
    decode_tasks = lw.config.max_batch * a["num_kv_heads"] * splits
    num_tasks = max(decode_tasks, 1 if lw.config.interpret else lw.config.target_programs)
    merge = lw.config.attention_merge_group and splits > 1
    fields = dict(
        q_off=lw.act(q), out_off=lw.act(node.output), num_heads=a["num_heads"], num_kv_heads=a["num_kv_heads"],
        head_dim=a["head_dim"], layer=layer, scale=float(a["scale"]), splits=splits,
        part_off=lw.layout.offset("attention_parts"), ticket_off=lw.layout.offset(f"tickets:v{node.output.id}"),
        num_tasks=num_tasks, merger=int(merge), step_kv_off=step_kv(lw))
    done = lw.tasks.add_group(Kind.ATTENTION, lw.tasks.add_desc(ATTENTION_FIELDS, fields), num_tasks,
                              f"attention.{layer}", lw.waits(q, cache), prefill_only_from=decode_tasks)
    if merge:  # a task a (sequence, query head) merges the splits' partials
        merges = lw.config.max_batch * a["num_heads"]
        desc = lw.tasks.add_desc(ATTENTION_FIELDS, {**fields, "num_tasks": merges, "merger": 2})
        done = lw.tasks.add_group(Kind.ATTENTION, desc, merges, f"attention_merge.{layer}", (done,))
    lw.ready[node.output.id] = done


def step_kv(lw: Lowering) -> int:
    """The ACT offset of the rows that every layer's QKV epilogue also writes the step's keys and values to, a
    row a token ([K heads, V heads]), and its attention's prefill blocks read (`attention_step_keys`); -1 where
    they are not written. One buffer for every layer: a layer's attention is done before the next QKV starts."""
    if not lw.config.attention_step_keys:
        return -1
    width = max(2 * n.attrs["kv_size"] for n in lw.graph.nodes if n.op == "qkv_rope_store")
    return lw.act_buffer("step_kv", lw.config.max_tokens_per_step * width)


def _layer_of(lw: Lowering, cache: Value) -> int:
    """The layer of an updated cache value: the kv_cache input its qkv_rope_store wrote."""
    for node in lw.graph.nodes:
        if node.op == "qkv_rope_store" and node.outputs[1].id == cache.id:
            return int(node.inputs[qkv_rope_store_inputs(node.attrs).index("cache")].name.rsplit(".", 1)[1])
    raise ValueError(f"attention reads %{cache.id}, which no qkv_rope_store writes")


@lowering("moe_route")
def _moe_route(lw: Lowering, node: Node) -> None:
    """Routing tasks, a token each where a step has no more tokens than the group has tasks (decode), else
    block_m each; each pair goes into its expert's list in the regions `v{ids}.entries` and `.active` that the
    experts read, counted in `tickets:v{ids}.counts` (zeroed every step)."""
    (logits,) = node.inputs
    weights, ids = node.outputs
    top_k, num_experts = node.attrs["top_k"], logits.shape[1]
    if num_experts > 1 << 16:  # the routing body packs an expert's index into 16 bits of its sort key
        raise ValueError(f"{num_experts} experts: the routing task takes at most {1 << 16}")
    T = lw.config.max_tokens_per_step
    num_tasks = max(-(-T // lw.config.block_m), min(T, lw.config.max_batch))
    desc = lw.tasks.add_desc(ROUTE_FIELDS, dict(
        logits_off=lw.act(logits), num_experts=num_experts, top_k=top_k, normalize=int(node.attrs["normalize"]),
        weights_off=lw.act(weights), ids_off=lw.layout.alloc(f"v{ids.id}", "I32", T * top_k),
        **_routing_regions(lw, ids, num_experts), num_tasks=num_tasks))
    # past the decode tokens' tasks, a task only routes in steps that prefill; where the router routes a step
    # that only decodes (`router_routes`), every task, and the routing's readers wait for the router too
    in_router = lw.config.routes_in_router and logits.id in lw.linear_descs
    done = lw.tasks.add_group(Kind.ROUTE, desc, num_tasks, "moe_route", lw.waits(logits),
                              prefill_only_from=0 if in_router else lw.config.max_batch)
    lw.ready[weights.id] = lw.ready[ids.id] = (done, *lw.waits(logits)) if in_router else done
    if in_router:
        router = lw.tasks.descs[lw.linear_descs[logits.id]]
        router[LINEAR_FIELDS.index("route_rel")] = (desc - lw.linear_descs[logits.id]) * DESC_WORDS
        router[LINEAR_FIELDS.index("route_ticket")] = lw.layout.offset(f"tickets:v{ids.id}.router")
        lw.constants["ROUTE_IN_ROUTER"] = 1
    lw.constants["NUM_EXPERTS_MAX"] = max(lw.constants.get("NUM_EXPERTS_MAX", 1), num_experts)
    lw.constants["TOP_K_MAX"] = max(lw.constants.get("TOP_K_MAX", 1), top_k)


def _routing_regions(lw: Lowering, ids: Value, num_experts: int) -> dict[str, int]:
    """The lists of pairs by expert that the routing tasks fill and the expert tasks read (`append_pairs` in
    codegen/bodies/moe.py): `capacity` entries an expert (a token chooses an expert once), the experts with
    any, and their counts."""
    T, name = lw.config.max_tokens_per_step, f"v{ids.id}"
    if f"{name}.entries" not in lw.layout.regions:
        lw.layout.alloc(f"{name}.entries", "I32", num_experts * T)
        lw.layout.alloc(f"{name}.active", "I32", num_experts)
    return dict(counts_off=lw.layout.offset(f"tickets:{name}.counts"), entries_off=lw.layout.offset(f"{name}.entries"),
                active_off=lw.layout.offset(f"{name}.active"), capacity=T)


@lowering("moe_experts")
def _moe_experts(lw: Lowering, node: Node) -> None:
    named = dict(zip(moe_experts_inputs(node.attrs), node.inputs))
    x, weights, ids, gate_up, down = (named[k] for k in ("x", "weights", "experts", "gate_up", "down"))
    residual = [named["residual"]] if "residual" in named else []
    num_experts, two_i, hidden = gate_up.shape
    top_k = weights.shape[1]
    cfg, T, name = lw.config, lw.config.max_tokens_per_step, f"moe.v{node.output.id}"
    routing = _routing_regions(lw, ids, num_experts)
    slots = cfg.moe_slots or min(num_experts, cfg.max_batch * top_k)
    h_off = lw.act_buffer(f"{name}.h", T * top_k * (two_i // 2))  # silu(gate) * up of each pair
    y_off = lw.act_buffer(f"{name}.y", T * top_k * hidden)

    claims = lw.layout.offset(f"tickets:{name}.claims") if cfg.expert_claims else -1

    def experts(x_off, k, w_off, n, out_off, gated, waits, part, stats_off=-1, combine=-1):
        tiles = _expert_tiles(cfg, n)
        # where a decode step's experts fill fewer tasks than there are programs, slots past them take experts
        # only in steps that prefill (which have more experts than slots): a slot serves every num_slots-th
        # expert, and a decode step has at most max_batch * top_k, each on a slot of its own. With fewer slots
        # than that (`moe_slots`), a decode step may need every slot
        step_slots = slots
        if slots >= cfg.max_batch * top_k:
            step_slots = max(slots, min(num_experts, T * top_k, cfg.target_programs // tiles))
        desc = lw.tasks.add_desc(EXPERT_FIELDS, dict(
            x_off=x_off, k=k, w_off=w_off, n=n, out_off=out_off, top_k=top_k, num_experts=num_experts,
            num_slots=step_slots, num_tiles=tiles, gated=gated, stats_off=stats_off, eps=float(node.attrs["eps"]),
            claims_off=claims + (0 if gated else _expert_tiles(cfg, two_i)) if claims >= 0 else -1,
            combine_rel=0, combine_tickets=-1, decode_slots=slots, **routing))
        if combine >= 0:  # the combine's descriptor, relative to this one (`expert_task`)
            lw.tasks.descs[desc][EXPERT_FIELDS.index("combine_rel")] = (combine - desc) * DESC_WORDS
            lw.tasks.descs[desc][EXPERT_FIELDS.index("combine_tickets")] = lw.layout.offset(f"tickets:{name}.combine")
        return lw.tasks.add_group(Kind.EXPERT, desc, step_slots * tiles, f"{name}.{part}", waits,
                                  prefill_only_from=slots * tiles if step_slots > slots else None)

    # an RMSNorm of x folded in: its weight scales gate/up's columns, and the tiles scale their rows by 1/rms;
    # or, where the config keeps it apart, a group of its own writes the normed rows that gate/up reads
    norm = named.get("norm_w")
    if norm is not None and not cfg.moe_fold_norm:
        normed = lw.act_buffer(f"{name}.normed", T * hidden)
        desc = lw.tasks.add_desc(RMS_NORM_FIELDS, dict(
            x_off=lw.act(x), hidden=hidden, stats_off=lw.stats[x.id], norm_w_off=lw.weight(norm),
            eps=float(node.attrs["eps"]), out_off=normed, rows_kind=_rows_kind(x)))
        norm_done = lw.tasks.add_group(Kind.RMS_NORM, desc, lw.column_tiles(hidden), f"{name}.norm", lw.waits(x))
        up = experts(normed, hidden, lw.placed_weight(gate_up, interleave_rows=True), two_i, h_off, 1,
                     (*lw.waits(ids), norm_done), "gate_up")
    else:
        up = experts(lw.act(x), hidden, lw.placed_weight(gate_up, scale_columns=norm, interleave_rows=True), two_i,
                     h_off, 1, lw.waits(ids, x), "gate_up", lw.stats[x.id] if norm is not None else -1)
    combine = lw.tasks.add_desc(COMBINE_FIELDS, dict(
        y_off=y_off, weights_off=lw.act(weights), top_k=top_k, hidden=hidden, out_off=lw.act(node.output),
        res_off=lw.act(residual[0]) if residual else -1, out_stats_off=lw.out_stats(node.output)))
    in_down = cfg.combines_in_down
    down_done = experts(h_off, two_i // 2, lw.weight(down), hidden, y_off, 0, (up,), "down",
                        combine=combine if in_down else -1)
    if in_down:  # down's tasks read what the combine group would wait for: they must follow it
        missing = [w for w in lw.waits(weights, *residual) if not lw.tasks.follows((down_done,), w.event)]
        if missing:
            raise ValueError(f"{name}: down does not follow {lw.tasks.event_names[missing[0].event]}, which its "
                             f"combine reads")
    # (combined in down's tasks where a step only decodes: the group's tasks then idle, and its readers wait
    # for down too)
    combine_waits = (down_done, *lw.waits(weights, *residual))
    if cfg.routes_in_router:  # (the routing's two waits would make four)
        combine_waits = lw.pruned(combine_waits)
    combine_done = lw.tasks.add_group(Kind.COMBINE, combine, lw.column_tiles(hidden), f"{name}.combine",
                                      combine_waits,
                                      prefill_only_from=0 if in_down else None)
    lw.ready[node.output.id] = (combine_done, down_done) if in_down else combine_done


def _expert_tiles(cfg: CompileConfig, n: int) -> int:
    """An expert projection's column tiles for n output columns."""
    return -(-n // cfg.expert_block_n)


def _add_sampling(lw: Lowering) -> None:
    logits = lw.graph.outputs["logits"]
    if logits.dtype.value != "f32" or "LOGITS_OFF" not in lw.constants:
        raise ValueError("the graph's logits must come from an fp32 fused_linear")
    splits = sample_splits(lw)
    desc = lw.tasks.add_desc(SAMPLE_FIELDS, dict(
        logits_off=lw.constants["LOGITS_OFF"], vocab=logits.shape[1], splits=splits,
        part_off=lw.layout.offset("sample_parts"), ticket_off=lw.layout.offset("tickets:sample"),
        # a sequence's chunks' largest z, then its top-k select's scratch (schedule.py, `_kth_largest`)
        top_off=lw.layout.alloc("sample_tops", "F32", lw.config.max_batch * (splits + sample_wide(lw) + 1))))
    lw.sample = lw.tasks.add_group(Kind.SAMPLE, desc, lw.config.max_batch * splits, "sample", lw.waits(logits))
