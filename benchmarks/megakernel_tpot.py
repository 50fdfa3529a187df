"""Time per output token of the megakernel: the median length of the steps in which every sequence of the
batch decodes (one token each, no prefill chunk), from the step log the kernel keeps (the global timer at
each step's planning), and its time to first token. As a script, times each of a list of kernel variants
(compiled side by side first) and prints the roofline share against the read bandwidth measured in the
same run: `python -m benchmarks.megakernel_tpot 1x512 1x512:attention_stages=3 ttft512:wide_n=128`.

The compiles need no GPU (the cache key holds no device): `BLINK_CACHE_DIR=.blink-cache python -m
benchmarks.megakernel_tpot --compile-only VARIANTS` on the CPU machine, then the same variants on the GPU with that
directory carried and BLINK_CACHE_DIR pointing at it, spares the device the minutes of ptxas."""
from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.baselines import read_bandwidth_tbs
from blinkc.build import build_graph
from blinkc.compile_model import WeightsSource, compile_many, compile_model
from codegen.config import CompileConfig
from ir.analysis import decode_bytes
from models.registry import resolve_model
from runtime.megakernel import Megakernel
from runtime.sampling import SamplingParams


def artifact_path(name: str) -> Path:
    """A fresh place for a benchmark's compiled artifact."""
    return Path(tempfile.mkdtemp(prefix="blink-bench-")) / f"{name}.cubin"


def prefill_budget(batch: int, context: int) -> int:
    """The prefill budget the decode benchmarks compile with: the batch's prompts in as few steps as 2,048 tokens
    a step allow (activations grow with it). Decode steps depend on it too: from 512 tokens a step the prefill
    tiles take 128 rows (`CompileConfig.prefill_rows`), whose registers and shared memory cost the decode bodies
    (H200, Llama-3-8B b1 ctx512 in one kernel, 64 / 128 rows: 4.61 / 4.78 ms in session 36 with 28 KB of L1; since
    fbfaf3e gave such kernels 60 KB, 4.62-4.63 / 4.67-4.68 in session 37; 4.50-4.51 / 4.52 in session 53, when
    they became the default at 512 tokens a step for TTFT 512 -9%). So every decode row's kernel (512 tokens a step
    or more) has 128-row tiles."""
    return max(256, min(2048, batch * context))


def decode_tokens(batch: int, context: int, tokens_per_step: int, num_tokens: int) -> int:
    """Tokens to generate so that at least `num_tokens` steps decode the whole batch: sequences that finish
    their prefill early decode alongside the others' prefill chunks, and finish early too."""
    return num_tokens + -(-batch * context // tokens_per_step) + 1


def decode_config(batch: int, context: int, num_tokens: int, **fields) -> CompileConfig:
    """The kernel a decode benchmark compiles: prompts of `context` tokens, and room for at least `num_tokens`
    steps that decode the whole batch; `max_tokens_per_step` among the fields replaces `prefill_budget`'s, and
    any other field these (`max_batch=8`: a batch of 1 in a kernel compiled for 8)."""
    per_step = fields.pop("max_tokens_per_step", prefill_budget(batch, context))
    new_tokens = decode_tokens(batch, context, per_step, num_tokens)
    return CompileConfig(**{**dict(max_batch=batch, max_tokens_per_step=per_step, max_model_len=context + new_tokens
                                   + 8, max_new_tokens=new_tokens), **fields})


def tpot_ms(kernel: Megakernel, batch: int, context: int, num_tokens: int, sampling: dict | None = None) -> float:
    """`sampling`: SamplingParams fields (default greedy), e.g. {"temperature": 0.8, "top_p": 0.95}."""
    prompts = [torch.randint(0, 1000, (context,)).tolist() for _ in range(batch)]
    params = SamplingParams(max_tokens=decode_tokens(batch, context, kernel.config.max_tokens_per_step, num_tokens),
                            ignore_eos=True, **({"temperature": 0} | (sampling or {})))
    kernel.generate(prompts, params)  # warm up
    kernel.generate(prompts, params)
    return full_batch_step_ms(kernel.step_log(), batch)


def full_batch_step_ms(steps: list[tuple[int, int, int]], batch: int) -> float:
    """Median length in ms of the logged steps (timer ns, tokens, sequences) that decode all `batch`
    sequences and nothing else; a step lasts until the next one is planned."""
    full = sorted(end - start for (start, tokens, seqs), (end, _, _) in zip(steps, steps[1:])
                  if tokens == seqs == batch)
    if not full:
        raise RuntimeError(f"no step decoded all {batch} sequences (tokens, sequences: {[s[1:] for s in steps]})")
    return full[len(full) // 2] / 1e6


def ttft_config(prompt_len: int, **fields) -> CompileConfig:
    """The kernel a time-to-first-token benchmark compiles: one prompt of `prompt_len` tokens in one chunk.
    `fields` may replace any of these (`max_batch=8,max_tokens_per_step=2048,max_model_len=2048`: `blinkc compile`'s
    defaults)."""
    return CompileConfig(**{**dict(max_batch=1, max_tokens_per_step=prompt_len, max_model_len=prompt_len + 8,
                                   max_new_tokens=40), **fields})


def seeded_prompt(prompt_len: int) -> list[int]:
    """A prompt of token ids below 1,000, the same for every run of a length."""
    return torch.randint(0, 1000, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()


def ttft_ms(kernel: Megakernel, prompt_len: int) -> tuple[float, float, int]:
    """Best of three launches that prefill one prompt and sample its first token, host to host; that launch's
    kernel alone (CUDA events around it); and the token (greedy, the prompt the same for every kernel of a
    length: variants of one model should agree on it)."""
    prompt = [seeded_prompt(prompt_len)]
    once = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    first = kernel.generate(prompt, once)[0].tokens[0]
    times = []
    kernel.time_launches = True
    try:
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            kernel.generate(prompt, once)
            torch.cuda.synchronize()
            times.append(((time.perf_counter() - start) * 1e3, kernel.last_launch_ms))
    finally:
        kernel.time_launches = False
    host, gpu = min(times)
    return host, gpu, first


def parse_field(value: str) -> int | str:
    """A variant's field value: an integer, or a string whose commas are written `+` (`outline=rows+small`)."""
    try:
        return int(value)
    except ValueError:
        return value.replace("+", ",")


@dataclass(frozen=True)
class Variant:
    """One kernel to time: `BATCHxCONTEXT[:field=v,...]` (decode TPOT) or `ttftN[:field=v,...]`."""
    spec: str
    batch: int
    context: int  # the prompt length for a TTFT variant
    is_ttft: bool
    fields: dict

    @classmethod
    def parse(cls, spec: str) -> Variant:
        shape, _, rest = spec.partition(":")
        items = (item.split("=", 1) for item in filter(None, rest.split(",")))
        fields = {key: parse_field(value) for key, value in items}
        if shape.startswith("ttft"):
            return cls(spec, 1, int(shape[4:]), True, fields)
        batch, context = (int(v) for v in shape.split("x"))
        return cls(spec, batch, context, False, fields)

    def config(self, num_tokens: int) -> CompileConfig:
        if self.is_ttft:
            return ttft_config(self.context, **self.fields)
        return decode_config(self.batch, self.context, num_tokens, **self.fields)


def main() -> None:
    parser = argparse.ArgumentParser(description="Megakernel TPOT / TTFT of each variant, compiled side by side first")
    parser.add_argument("variants", nargs="+", metavar="VARIANT",
                        help="BATCHxCONTEXT or ttftPROMPT, then optional :field=value,... CompileConfig fields "
                             "(e.g. 1x512 1x512:attention_stages=3 ttft512:wide_n=128 1x512:outline=rows+small)")
    parser.add_argument("--preset", default="llama3-8b")
    parser.add_argument("--tokens", type=int, default=32, help="full-batch decode steps to take the median of")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the variants into the cache (BLINK_CACHE_DIR) and stop: on the CPU machine, "
                             "so that a GPU call carrying that directory finds them compiled")
    parser.add_argument("--sampling", action="append", default=[], metavar="FIELD=VALUE,...",
                        help="SamplingParams of the decode steps (default greedy), e.g. temperature=0.8,top_p=0.95; "
                             "repeated: each decode variant is timed under each, on one load ('greedy': none)")
    args = parser.parse_args()
    samplings = [{key: float(value) if key in ("temperature", "top_p") else int(value)
                  for key, value in (item.split("=", 1) for item in spec.split(",") if item and item != "greedy")}
                 for spec in args.sampling or [""]]
    variants = [Variant.parse(spec) for spec in args.variants]
    model = resolve_model(args.preset)
    try:
        seconds = compile_many([(args.preset, v.config(args.tokens)) for v in variants])
        print(f"compiled {len(variants)} kernels side by side in {seconds:.0f} s", flush=True)
    except RuntimeError as error:  # the others are cached: time them, and say which failed below
        print(error, flush=True)
    if args.compile_only:
        return
    bandwidth = read_bandwidth_tbs("cuda")
    for variant in variants:
        try:
            run(args.preset, model, variant, args.tokens, bandwidth, samplings)
        except Exception as error:  # a sweep goes on past a variant that does not compile or run
            print(f"{args.preset} {variant.spec}: failed: {type(error).__name__}: {str(error).splitlines()[0]}",
                  flush=True)


def run(preset: str, model, variant: Variant, num_tokens: int, bandwidth: float, samplings: list[dict]) -> None:
    config = variant.config(num_tokens)
    path = compile_model(model, config, artifact_path("bench"), WeightsSource(seed=0)).path
    kernel = Megakernel.load(path, device="cuda", timeout_s=120)
    launcher = kernel.kernel
    resources = (f"grid {launcher.grid[0]}, {launcher.n_regs} registers, {launcher.n_spills} spilled, "
                 f"{launcher.shared} B shared")
    if variant.is_ttft:
        ms, kernel_ms, first = ttft_ms(kernel, variant.context)
        print(f"{preset} {variant.spec}: TTFT {ms:.2f} ms (the kernel {kernel_ms:.2f}; first token {first}) | "
              f"{resources}", flush=True)
    else:
        read = decode_bytes(build_graph(model, config), variant.batch, variant.context).total
        roofline = read / (bandwidth * 1e12) * 1e3
        for sampling in samplings:
            ms = tpot_ms(kernel, variant.batch, variant.context, num_tokens, sampling)
            label = f" [{','.join(f'{k}={v}' for k, v in sampling.items()) or 'greedy'}]" if len(samplings) > 1 else ""
            print(f"{preset} {variant.spec}{label}: TPOT {ms:.2f} ms | roofline {roofline:.2f} ms at "
                  f"{bandwidth:.2f} TB/s ({roofline / ms:.0%}) | {variant.batch * 1e3 / ms:.0f} tok/s | {resources}",
                  flush=True)
    del kernel
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
