"""`blink`: talk to a model. `blink chat` runs a conversation through the model's chat template on the
reference engine; serving a compiled megakernel over HTTP (`blink serve`) arrives with the server."""
from __future__ import annotations

import argparse
import sys

from blinkc.cli import USER_ERRORS
from blinkc.generate import ChatSession, random_checkpoint_dir
from models.presets import preset_names
from models.registry import resolve_model
from runtime.sampling import SamplingParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="blink", description="Talk to a model.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    p = sub.add_parser("chat", help="chat on the reference engine (one --message, or lines from stdin)")
    p.add_argument("model", metavar="MODEL", help="an HF checkpoint directory, or a preset with --random-weights")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--message", help="send one message and exit")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        return _chat(args)
    except USER_ERRORS as err:
        print(f"blink: error: {err}", file=sys.stderr)
        return 2


def _chat(args) -> int:
    if args.random_weights and args.model not in preset_names():
        raise ValueError(f"--random-weights needs a preset, got {args.model!r}")
    ref = random_checkpoint_dir(args.model, seed=0) if args.random_weights else args.model
    session = ChatSession(resolve_model(ref), SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature))
    lines = [args.message] if args.message is not None else (line.rstrip("\n") for line in sys.stdin)
    for line in lines:
        print(session.reply(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
