"""The Blink IR: a graph of typed values and registered ops, traced from a model definition.

`ir` imports nothing else of Blink's. Everything after tracing (passes, the reference executor, the
lowering to megakernel tasks) reads and writes `Graph`. The tracer loads on first use (PEP 562): it
needs the op registry, which imports torch, and reading a dtype or a graph does not.
"""
from ir.dtypes import DType
from ir.graph import Graph, Node, Param, Source, Value

__all__ = ["DType", "Graph", "Node", "Param", "Source", "Tensor", "Tracer", "Value"]


def __getattr__(name: str):
    if name in ("Tensor", "Tracer"):
        from ir import tracer

        return getattr(tracer, name)
    raise AttributeError(f"module 'ir' has no attribute {name!r}")
