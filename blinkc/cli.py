"""`blinkc`: inspect models, write random checkpoints, generate with the reference engine.

Every user error (unknown preset, missing directory, malformed config, unsupported architecture, a kernel
that hangs) ends in one line on stderr and exit code 2. torch loads only in the commands that need it: a
compile that the cache answers takes a fraction of a second.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ir import DType
from models.presets import preset_config, preset_names
from models.registry import resolve_model

USER_ERRORS = (ValueError, OSError, MemoryError)  # OSError takes in runtime.megakernel.HangError, a TimeoutError


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except USER_ERRORS as err:
        print(f"blinkc: error: {err}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="blinkc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _add_inspect(sub)
    _add_weights(sub)
    _add_generate(sub)
    _add_compile(sub)
    _add_run(sub)
    return parser


def _model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL",
                   help=f"a preset ({', '.join(preset_names())}) or an HF checkpoint directory")


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="graph summary, parameters, bytes per decode step and roofline")
    _model_arg(p)
    p.add_argument("--context", type=int, default=512, help="tokens in each sequence's KV cache (default 512)")
    p.add_argument("--batch", type=int, default=1, help="sequences per decode step (default 1)")
    p.add_argument("--bandwidth", type=float, metavar="TB/S", help="memory read bandwidth for the roofline")
    p.add_argument("--graph", action="store_true", help="also print the whole graph")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    from blinkc.inspect_model import inspect_report

    if args.context < 1 or args.batch < 1 or (args.bandwidth is not None and args.bandwidth <= 0):
        raise ValueError("--context and --batch must be at least 1 and --bandwidth positive")
    print(inspect_report(resolve_model(args.model), context=args.context, batch=args.batch,
                         bandwidth_tbs=args.bandwidth, show_graph=args.graph))
    return 0


def _add_weights(sub) -> None:
    p = sub.add_parser("weights", help="write an HF-format checkpoint directory with random weights")
    p.add_argument("--random", required=True, metavar="PRESET", help="the preset whose config to use")
    p.add_argument("dir", metavar="DIR", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-shard-size", type=int, default=2 << 30, metavar="BYTES")
    p.set_defaults(run=_run_weights)


def _run_weights(args) -> int:
    from blinkc.random_checkpoint import write_random_checkpoint

    out = write_random_checkpoint(preset_config(args.random), args.dir, seed=args.seed,
                                  max_shard_bytes=args.max_shard_size)
    print(f"wrote random {args.random} checkpoint to {out}")
    return 0


def _add_generate(sub) -> None:
    p = sub.add_parser("generate", help="generate text with the reference engine (host-driven, torch)")
    _model_arg(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--random-weights", action="store_true", help="use a cached random checkpoint of the preset")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--dtype", choices=["bf16", "f32"], help="compute dtype (default: the checkpoint's)")
    p.add_argument("--json", action="store_true", help="print the generated token ids as JSON")
    p.set_defaults(run=_run_generate)


def _run_generate(args) -> int:
    from blinkc.generate import generate_text, random_checkpoint_dir
    from runtime.sampling import SamplingParams

    if args.random_weights and args.model not in preset_names():
        raise ValueError(f"--random-weights needs a preset, got {args.model!r}")
    ref = random_checkpoint_dir(args.model, seed=0) if args.random_weights else args.model
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed)
    text, ids = generate_text(resolve_model(ref), args.prompt, params, chat=args.chat,
                              dtype=DType(args.dtype) if args.dtype else None)
    print(json.dumps(ids) if args.json else text)
    return 0


def _add_compile(sub) -> None:
    p = sub.add_parser("compile", help="compile a model into one persistent megakernel (cubin + manifest)")
    _model_arg(p)
    p.add_argument("-o", "--output", type=Path, required=True, metavar="FILE", help="e.g. model.cubin")
    weights = p.add_mutually_exclusive_group()
    weights.add_argument("--weights", type=Path, metavar="DIR", help="HF checkpoint to load at run time")
    weights.add_argument("--random-weights", action="store_true", help="random weights made on the device from --seed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-tokens-per-step", type=int, default=2048,
                   help="prefill chunk budget: a longer prompt prefills over several steps (default 2048)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", choices=["bf16", "f32"], help="compute dtype (default: the model's)")
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: H100/H200)")
    p.add_argument("--interpret", action="store_true", help="for the Triton interpreter on a CPU (no cubin)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="any other codegen.config.CompileConfig field, e.g. stream_gemv=0 (repeatable)")
    p.set_defaults(run=_run_compile)


def compile_settings(items: list[str]) -> dict[str, int | str]:
    """`--set FIELD=VALUE` items as CompileConfig fields: an integer for a number or a switch (0 / 1), else the
    text."""
    from dataclasses import fields

    from codegen.config import CompileConfig

    kinds = {f.name: str(f.type) for f in fields(CompileConfig)}  # "int", "bool", "str" (postponed annotations)
    settings: dict[str, int | str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in kinds:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with a field of codegen.config.CompileConfig")
        if kinds[name] == "str":
            settings[name] = value
            continue
        try:
            settings[name] = int(value)
        except ValueError:
            raise ValueError(f"--set {item!r}: {name} takes an integer") from None
    return settings


def _run_compile(args) -> int:
    from blinkc.compile_model import WeightsSource, compile_model
    from codegen.config import CompileConfig

    model = resolve_model(args.model)
    if args.weights is None and not args.random_weights and model.checkpoint_dir is None:
        raise ValueError("a preset needs --weights DIR or --random-weights")
    checkpoint = args.weights or (None if args.random_weights else model.checkpoint_dir)
    tokenizer = checkpoint if checkpoint is not None else _random_tokenizer_dir(args.model, model)
    config = CompileConfig(**{**dict(max_batch=args.max_batch, max_tokens_per_step=args.max_tokens_per_step,
                                     max_model_len=args.max_model_len, max_new_tokens=args.max_new_tokens,
                                     page_size=args.page_size, interpret=args.interpret),
                              **compile_settings(args.set)})
    result = compile_model(model, config, args.output, WeightsSource(checkpoint, seed=args.seed), arch=args.arch,
                           dtype=DType(args.dtype) if args.dtype else None, tokenizer_dir=tokenizer,
                           progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    how = "from cache" if result.cached else "cold"
    print(f"wrote {result.path} ({result.num_tasks} tasks) in {result.seconds:.1f} s ({how})")
    if result.resources:
        print(f"kernel: {result.resources}")
    return 0


def _random_tokenizer_dir(name: str, model) -> Path:
    """Random weights need a tokenizer for text: the family's small BPE, written once into the cache."""
    from blinkc.env import cache_dir

    out = cache_dir() / "tokenizers" / f"{model.definition.tokenizer_style}-{model.config.vocab_size}"
    if not (out / "tokenizer_config.json").exists():
        from blinkc.random_tokenizer import write_random_tokenizer

        write_random_tokenizer(out, model.definition.tokenizer_style, model.config.vocab_size)
    return out


def _add_run(sub) -> None:
    p = sub.add_parser("run", help="run prompts through a compiled megakernel")
    p.add_argument("artifact", type=Path, metavar="MODEL.cubin")
    p.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--json", action="store_true", help="print the generated token ids")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a running kernel is a hang")
    p.add_argument("--no-gluon", action="store_true",
                   help="every step in the compiled kernel (default on a Hopper GPU: one prompt on the Gluon kernels, "
                        "its prefill's layers in one persistent launch and its decode steps in another)")
    p.set_defaults(run=_run_run)


def _run_run(args) -> int:
    from blinkc.env import use_interpreter_without_gpu

    use_interpreter_without_gpu()
    from dpu.tokenizer import Tokenizer
    from runtime.megakernel import Megakernel
    from runtime.sampling import SamplingParams

    kernel = Megakernel.load(args.artifact, timeout_s=args.timeout, gluon=False if args.no_gluon else None)
    tokenizer_dir = kernel.manifest.get("tokenizer")
    if not tokenizer_dir:
        raise ValueError(f"{args.artifact}: the manifest names no tokenizer")
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
    completions = kernel.generate([tokenizer.encode(p) for p in args.prompt], params)
    for c in completions:
        print(json.dumps(c.tokens) if args.json else tokenizer.decode(c.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
