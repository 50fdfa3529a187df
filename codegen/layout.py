"""Memory layout: every buffer the kernel touches is a region of one of a few arenas.

    W    weights (model dtype)            ACT  activations (model dtype)
    F32  norm statistics, logits, rope frequencies, sampling parameters
    I32  step metadata, request state, page lists, prompts, outputs, MoE routing
    KV   the paged cache of all layers: [layers, 2, pages, page_size, kv_heads, head_dim]

Offsets are in elements of the arena's dtype. Regions are named, so the runtime can read and write them
from the manifest alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

ALIGN = 64  # elements: 128 bytes in bf16


def aligned(size: int) -> int:
    """`size` elements rounded up to whole ALIGN blocks: the room a region takes."""
    return -(-int(size) // ALIGN) * ALIGN


@dataclass(frozen=True)
class Region:
    arena: str
    offset: int
    size: int


@dataclass
class Layout:
    regions: dict[str, Region] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=lambda: {"W": 0, "ACT": 0, "F32": 0, "I32": 0})

    def alloc(self, name: str, arena: str, size: int) -> int:
        if name in self.regions:
            raise ValueError(f"region {name!r} allocated twice")
        offset = self.sizes[arena]
        self.regions[name] = Region(arena, offset, int(size))
        self.sizes[arena] = offset + aligned(size)
        return offset

    def place(self, name: str, arena: str, offset: int, size: int) -> int:
        """A region at a given offset, which other regions may share (`codegen.lower.shared_activations`)."""
        if name in self.regions:
            raise ValueError(f"region {name!r} allocated twice")
        self.regions[name] = Region(arena, offset, int(size))
        self.sizes[arena] = max(self.sizes[arena], offset + aligned(size))
        return offset

    def offset(self, name: str) -> int:
        return self.regions[name].offset

    def to_dict(self) -> dict:
        return {"sizes": dict(self.sizes),
                "regions": {k: [r.arena, r.offset, r.size] for k, r in self.regions.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        return cls({k: Region(a, o, s) for k, (a, o, s) in d["regions"].items()}, dict(d["sizes"]))


# The control words, by index: the planner, the sampler and the waits (bodies/schedule.py, bodies/sync.py)
# address them as CONTROL + index, so keep this order.
CONTROL_FIELDS = ("num_tokens", "num_seqs", "done", "step", "num_requests", "num_eos",
                  "error_flag", "error_step", "error_task", "error_event", "error_value", "error_target",
                  "task_tickets", "logits_seqs", "error_kind")

# error_flag: 0 while running; else every wait gives up: 1 (ABORT_HANG) a wait ran out of spins, 2 (ABORT_ASKED) the
# host asked the kernel to stop, its launch past the runtime's timeout. error_kind: who recorded error_step ..
# error_target, 0 until the first wait to give up does (bodies/sync.py, `record_hang`): 1 (ABORT_HANG) one that ran
# out of spins, 3 (ABORT_ASKED_RECORDED) one that saw the host's flag. A word of its own, taken by compare-and-swap,
# so that the host's write of the flag can never undo a record
ABORT_HANG, ABORT_ASKED, ABORT_ASKED_RECORDED = 1, 2, 3
HANG_SPLIT_TICKET = -2  # the error_task of a hang in a split-K block's wait for its other splits (`split_slices`)

STEP_REGIONS = {  # name -> size: T tokens, B sequences, R requests, P pages, M prompt and O output tokens
    "input_ids": "T", "positions": "T", "slots": "T",
    "seq_starts": "B+1", "context_lens": "B", "seq_req": "B", "logits_rows": "B", "seq_final": "B",
    "req_prompt_off": "R", "req_prompt_len": "R", "req_cached": "R", "req_num_out": "R",
    "req_max_tokens": "R", "req_finished": "R", "req_last": "R", "req_seed": "R", "req_top_k": "R",
    "req_ignore_eos": "R", "req_pages": "R*P", "prompts": "R*M", "out_tokens": "R*O", "eos_ids": "8",
    "step_log": "LOG",  # per step (mod STEP_LOG): global timer when planned (low, high word), tokens, sequences
}
STEP_LOG = 4096
PARK_WORDS = 32  # a program's parked worker-loop state: one 128-byte line


def add_step_regions(layout: Layout, *, T: int, B: int, R: int, P: int, M: int, O: int) -> None:
    """The control words and the step/request regions of the I32 arena, and sampling floats in F32."""
    layout.alloc("control", "I32", len(CONTROL_FIELDS))
    sizes = {"T": T, "B": B, "B+1": B + 1, "R": R, "R*P": R * P, "R*M": R * M, "R*O": R * O, "8": 8,
             "LOG": STEP_LOG * 4}
    for name, size in STEP_REGIONS.items():
        layout.alloc(name, "I32", sizes[size])
    layout.alloc("req_temperature", "F32", R)
    layout.alloc("req_top_p", "F32", R)
