"""The probes' variants: a dataclass of integer fields, written `name=value,...` on the command line (after a
kind, for the probes whose variants have one)."""
from __future__ import annotations

from dataclasses import fields, replace


def with_fields(base, items: list[str], spec: str):
    """`base` with the integer fields named in items (`name=value` each) replaced; a name `base` lacks exits
    with a one-line message that names the known ones."""
    pairs = [item.split("=", 1) for item in items if item]
    known = {f.name for f in fields(base) if f.type in (int, "int")}
    unknown = [key for key, *_ in pairs if key not in known]
    if unknown:
        raise SystemExit(f"variant {spec!r}: unknown fields {unknown}; known: {sorted(known)}")
    return replace(base, **{key: int(value) for key, value in pairs})


def with_kind(cls, spec: str, kinds: tuple[str, ...]):
    """`cls(kind)` for a spec `kind,name=value,...` whose kind is one of `kinds`, with those fields."""
    kind, *items = spec.split(",")
    if kind not in kinds:
        raise SystemExit(f"variant {spec!r}: starts with one of {', '.join(kinds)}")
    return with_fields(cls(kind), items, spec)
