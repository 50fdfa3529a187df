"""The Blink IR: a graph of typed values and registered ops, traced from a model definition.

`ir` imports nothing else of Blink's. Everything after tracing (passes, the reference executor, the
lowering to megakernel tasks) reads and writes `Graph`.
"""
from ir.dtypes import DType
from ir.graph import Graph, Node, Param, Source, Value
from ir.tracer import Tensor, Tracer

__all__ = ["DType", "Graph", "Node", "Param", "Source", "Tensor", "Tracer", "Value"]
