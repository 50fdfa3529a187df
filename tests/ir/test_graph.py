"""Tracer, verifier and text form."""
from __future__ import annotations

import dataclasses

import pytest

from ir import DType, Source, Tracer, ops
from ir.graph import Node, Param, Value
from ir.printer import format_graph
from ir.verify import VerifyError, verify


def small_graph():
    tr = Tracer()
    x = tr.input("x", ("T", 8), DType.f32)
    w = tr.param("w", (4, 8), DType.f32)
    y = ops.linear(ops.rms_norm(x, tr.param("n", (8,), DType.f32), 1e-6), w)
    return tr.finish({"y": y}, {"name": "small"})


def test_tied_params_are_one_value_and_redeclaring_differently_fails():
    tr = Tracer()
    a = tr.param("embed", (10, 4), DType.bf16)
    assert tr.param("embed", (10, 4), DType.bf16).value is a.value
    with pytest.raises(ValueError, match="redeclared"):
        tr.param("embed", (10, 5), DType.bf16)


def test_verifier_accepts_a_traced_graph_and_rejects_use_before_definition():
    graph = verify(small_graph())
    swapped = dataclasses.replace(graph, nodes=graph.nodes[::-1])
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(swapped)


def test_verifier_rejects_wrong_recorded_types():
    graph = small_graph()
    node = graph.nodes[-1]
    bad = Node(node.op, node.inputs, (Value(node.output.id, ("T", 5), DType.f32),), node.attrs)
    with pytest.raises(VerifyError, match="shape rule gives"):
        verify(dataclasses.replace(graph, nodes=(*graph.nodes[:-1], bad)))


def test_verifier_rejects_sources_outside_the_param():
    graph = small_graph()
    w = graph.param("w")
    bad = Param(w.value, (Source("a", ((0, 2),)), Source("b", ((2, 5),))))
    with pytest.raises(VerifyError, match="outside"):
        verify(dataclasses.replace(graph, params=tuple(bad if p is w else p for p in graph.params)))


def test_text_form_lists_inputs_params_nodes_and_outputs():
    text = format_graph(small_graph())
    assert text.splitlines()[0] == "graph small (1 inputs, 2 params, 2 nodes)"
    assert "  %0 = input x : f32[T,8]" in text
    assert "= rms_norm(@x, @n, eps=1e-06, group=8) : f32[T,8]" in text
    assert text.splitlines()[-1].startswith("  return y = %")
