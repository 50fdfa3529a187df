"""Task bodies: Triton device functions the megakernel calls, one module per task kind.

Each body reads its operands from a descriptor row (int64 words, laid out by the `*_FIELDS` tuple next
to it) and the step's metadata, and is unit-tested on its own against the op's reference implementation.
"""

# The bodies `CompileConfig.outline` can compile as functions of their own (`noinline`), by group. Without
# `pin_thread_ids` (codegen/llir.py), an inlined body's per-thread index math is hoisted out of the persistent loop
# and spilled (166 values stored at the kernel's start, reloaded in the bodies), and outlined, a body computes its
# own; with it, outlining only changes how ptxas allocates registers, and each call costs: near even on
# Llama-3-8B, 42% slower on Qwen3-30B-A3B at b1 (RESULTS.md, session 18). Since the step's state is parked, "rows"
# costs neither (session 57) and, outlined by default, cuts the cold compile by ~30% (`CompileConfig.outline`).
# None but "dots" issues Hopper's tensor-core dots (wgmma: Triton takes them for 64 rows and more), and outlining
# those serializes every wgmma of the kernel (ptxas: "wgmma pipeline crossing function boundary").
# Helpers that are functions of their own whatever `outline` says: the sampled part of a sampling task, whose
# registers inlined cost greedy Llama-3-8B b64 2-3% (benchmarks/RESULTS.md, session 25), and its pass over the
# row's masses, which inlined in it cost greedy b64 1.2% (session 26).
ALWAYS_OUTLINED = ("_sample", "_masses")
OUTLINE_GROUPS = {
    "rows": ("linear_rows", "qkv_rows"),  # projections of up to block_m rows: the GEMV and the few-row dots
    "decode_attention": ("decode_rows", "merge_head"),
    "small": ("embed_task", "gather_task", "rms_norm_task", "add_task", "route_task", "combine_task", "sample_task"),
    "dots": ("linear_task", "qkv_task", "attention_task", "expert_task"),
}
