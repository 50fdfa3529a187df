"""The Gluon kernels the runtime launches (`runtime.gluon`; for one request, `OneRequest`: the prefill chain, the LM
head's GEMV and the one-row loop, and for a prompt shorter than the chain takes, the stream-K projections and
attention; for a batch, `Batch`: the batched loop), from cubins compiled ahead of time into Blink's cache where it
has one for a launch's constexprs and options, else by Triton's JIT at the launch.

`blinkc compile` compiles them beside the kernel for a Hopper bf16 target (`precompile`, for the launches
`GluonCoverage.one_request_launches` and `batch_launches` list, on 132 SMs: an H100 or H200), so that the runtime
loads them as it loads the kernel, compiling nothing. By the JIT, a first run on a machine compiled them at its
first launches: the first generation of a 10-token prompt took 10.9 s on the H200 machine, from the cache 1.57 s
(session 66; the rest is Triton's launcher stubs). A launch whose arguments are not what the cubin was compiled for
(a pointer of another type, or off the 16 bytes it takes) goes to the JIT too.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

UNALIGNED = frozenset({"EVENTS"})  # the chains' counters, after the host's stop word: 4 bytes into their allocation
OPTIONS = ("num_warps", "maxnreg")  # a launch's keywords that are not the kernel's arguments
_POINTERS = {"torch.int64": "*i64", "torch.int32": "*i32", "torch.bfloat16": "*bf16", "torch.float32": "*fp32"}


@functools.cache
def _source_digest() -> str:
    """The compiler's source (codegen/: the Gluon bodies and what they import of it) and Triton's version, read once
    a process (`importlib.metadata.version` alone takes ~0.3 ms)."""
    h = hashlib.sha256(version("triton").encode())
    for path in sorted((Path(__file__).resolve().parent.parent / "codegen").rglob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()


def _name(fn) -> str:
    return f"{fn.fn.__module__}.{fn.fn.__qualname__}"


def _plain(values: dict) -> dict:
    """Constexpr values as plain Python values (a `gl.constexpr` as its value)."""
    return {name: getattr(value, "value", value) for name, value in values.items()}


def kernel_key(fn, constexprs: dict, options: dict, arch: int = 90) -> str:
    """The cache key of fn's cubin for these constexprs and launch options: also the target, Triton's version and the
    compiler's source."""
    text = json.dumps([_name(fn), sorted(_plain(constexprs).items()), sorted(options.items()), arch,
                       _source_digest()])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def folder(fn, constexprs: dict, options: dict, arch: int = 90) -> Path:
    from blinkc.env import cache_dir

    return cache_dir() / "cubins" / f"gluon-{kernel_key(fn, constexprs, options, arch)}"


def precompile(fn, signature: dict[str, str], constexprs: dict, options: dict, arch: int = 90) -> Path:
    """fn's cubin for these constexprs and options (`codegen.gluon.compile_ahead`), compiled into the cache unless
    there already; returns its folder."""
    from codegen.gluon import compile_ahead

    target = folder(fn, constexprs, options, arch)
    if (target / "kernel.json").exists():
        return target
    compiled = compile_ahead(fn, signature, constexprs, options["num_warps"], options["maxnreg"], UNALIGNED, arch)
    metadata = dict(compiled.metadata._asdict())
    metadata["target"] = {"backend": "cuda", "arch": arch, "warp_size": 32}
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent))
    try:
        (tmp / "kernel.cubin").write_bytes(compiled.asm["cubin"])
        (tmp / "kernel.json").write_text(json.dumps(metadata, default=vars))
        tmp.rename(target)
    except OSError:  # a compile of the same key beside this one got there first
        if not (target / "kernel.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class Ahead:
    """`fn[grid](*args, **constexprs, **options)` as Triton's JIT takes it (the runtime arguments positional, as
    `signature` names and types them: fn's first; the constexprs and options by name), launched from the cache's
    cubin where there is one for them and the arguments are what it was compiled for, else by the JIT."""

    def __init__(self, fn, signature: dict[str, str]) -> None:
        parameters = inspect.signature(fn.fn).parameters
        self.names = list(parameters)
        if self.names[:len(signature)] != list(signature):
            raise ValueError(f"{_name(fn)} does not take {list(signature)} first")
        self.fn, self.signature = fn, signature
        self.defaults = {name: p.default for name, p in parameters.items()
                         if p.default is not inspect.Parameter.empty and name not in signature}
        self._loaded: dict[tuple, object] = {}  # (constexprs, options) -> the loaded cubin, None if not in the cache
        self.launches_ahead = self.launches_jit = 0  # (for the tests: how many launches took the cache's cubin)

    def __getitem__(self, grid: tuple[int, ...]):
        return functools.partial(self._launch, tuple(grid) + (1,) * (3 - len(grid)))

    def _launch(self, grid: tuple[int, int, int], *args, **kwargs) -> None:
        options = {name: kwargs.pop(name) for name in OPTIONS if name in kwargs}
        constexprs = _plain({**self.defaults, **kwargs})
        compiled = self._compiled(constexprs, options) if self._fits(args) else None
        if compiled is None:
            self.fn[grid](*args, **kwargs, **options)
            self.launches_jit += 1
            return
        compiled[grid](*args, *(constexprs[name] for name in self.names[len(args):]))
        self.launches_ahead += 1

    def _fits(self, args: tuple) -> bool:
        """Whether the runtime arguments are what a cubin is compiled for: pointers of the signature's types, 16-byte
        aligned but the UNALIGNED ones, 32-bit integers in range."""
        if len(args) != len(self.signature):
            return False
        for (name, kind), arg in zip(self.signature.items(), args):
            if kind.startswith("*"):
                if _POINTERS.get(str(getattr(arg, "dtype", None))) != kind:
                    return False
                if name not in UNALIGNED and arg.data_ptr() % 16:
                    return False
            elif kind == "i32" and not -2**31 <= int(arg) < 2**31:
                return False
        return True

    def _compiled(self, constexprs: dict, options: dict):
        """The cache's cubin for these constexprs (plain values) and options, loaded on the current GPU the first time
        (None if not there). A launch's lookup is a dict's: the key's hash is not on the launch path."""
        memo = (tuple(sorted(constexprs.items())), tuple(sorted(options.items())))
        if memo not in self._loaded:
            self._loaded[memo] = None
            where = folder(self.fn, constexprs, options)
            if (where / "kernel.json").exists():
                from runtime.megakernel import compiled_kernel

                signature = {name: self.signature.get(name, "constexpr") for name in self.names}
                self._loaded[memo] = compiled_kernel(
                    self.fn.fn.__name__, signature, json.loads((where / "kernel.json").read_text()),
                    (where / "kernel.cubin").read_bytes(), where.name,
                    {name: constexprs[name] for name in self.names[len(self.signature):]})
        return self._loaded[memo]


_KERNELS: dict = {}


def ahead(fn, signature: dict[str, str]) -> Ahead:
    """fn's `Ahead`, one a process (its loaded cubins kept)."""
    if fn not in _KERNELS:
        _KERNELS[fn] = Ahead(fn, signature)
    return _KERNELS[fn]
