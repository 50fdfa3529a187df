"""runtime.checkpoint (which shard holds which tensor) and runtime.weights (placing streamed tensors)."""
from __future__ import annotations

import json
import weakref

import pytest
import torch
from safetensors.torch import save_file

from runtime.checkpoint import INDEX_FILE, SINGLE_FILE, CheckpointIndex
from runtime.weights import WeightSpec, place_weights, transform_weight


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(5, 3, generator=g), "b.weight": torch.randn(7, generator=g),
            "c.bias": torch.randn(2, 3, 2, generator=g)}


def _write_sharded(root, shards: dict[str, dict[str, torch.Tensor]]) -> None:
    for name, tensors in shards.items():
        save_file(tensors, root / name)
    weight_map = {key: name for name, tensors in shards.items() for key in tensors}
    (root / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _read_all(index: CheckpointIndex, keys: set[str]) -> dict[str, torch.Tensor]:
    return dict(index.read(keys))


def test_single_file_checkpoint(tmp_path):
    tensors = _tensors()
    save_file(tensors, tmp_path / SINGLE_FILE)
    index = CheckpointIndex.open(tmp_path)
    assert index.shard_of == {key: SINGLE_FILE for key in tensors}
    assert index.shards() == [SINGLE_FILE]
    got = _read_all(index, {"a.weight", "c.bias"})
    assert sorted(got) == ["a.weight", "c.bias"]
    for key, tensor in got.items():
        assert torch.equal(tensor, tensors[key]), key


def test_sharded_checkpoint_reads_shard_by_shard(tmp_path):
    tensors = _tensors(1)
    shards = {"model-2.safetensors": {"a.weight": tensors["a.weight"]},
              "model-1.safetensors": {"b.weight": tensors["b.weight"], "c.bias": tensors["c.bias"]}}
    _write_sharded(tmp_path, shards)
    index = CheckpointIndex.open(tmp_path)
    assert index.shards() == ["model-1.safetensors", "model-2.safetensors"]
    assert index.shard_of["a.weight"] == "model-2.safetensors"
    order = [key for key, _ in index.read(set(tensors))]
    assert order == ["b.weight", "c.bias", "a.weight"], "tensors must come shard by shard, in shard order"
    for key, tensor in _read_all(index, set(tensors)).items():
        assert torch.equal(tensor, tensors[key]), key


def test_index_is_preferred_over_a_stray_single_file(tmp_path):
    tensors = _tensors(2)
    save_file({"stale": torch.zeros(1)}, tmp_path / SINGLE_FILE)
    _write_sharded(tmp_path, {"s.safetensors": tensors})
    assert set(CheckpointIndex.open(tmp_path).shard_of) == set(tensors)


def test_missing_directory(tmp_path):
    with pytest.raises(ValueError, match="no such checkpoint directory"):
        CheckpointIndex.open(tmp_path / "absent")


def test_directory_without_safetensors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=f"no {SINGLE_FILE} or {INDEX_FILE}"):
        CheckpointIndex.open(tmp_path)


@pytest.mark.parametrize("text", ['{"weight_map": {"a": "s.safe', '{"metadata": {}}', '[1, 2]'],
                         ids=["truncated", "no-weight-map", "not-an-object"])
def test_malformed_index(tmp_path, text):
    (tmp_path / INDEX_FILE).write_text(text)
    with pytest.raises(ValueError, match="malformed index"):
        CheckpointIndex.open(tmp_path)


@pytest.mark.parametrize("weight_map", [["a.weight"], {"a.weight": 3}], ids=["list", "non-string-shard"])
def test_index_with_a_weight_map_of_the_wrong_type(tmp_path, weight_map):
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match="malformed index"):
        CheckpointIndex.open(tmp_path)


def test_index_naming_a_missing_shard(tmp_path):
    tensors = _tensors(3)
    _write_sharded(tmp_path, {"present.safetensors": {"a.weight": tensors["a.weight"]},
                              "gone.safetensors": {"b.weight": tensors["b.weight"]}})
    (tmp_path / "gone.safetensors").unlink()
    with pytest.raises(ValueError, match="lists shard 'gone.safetensors', which is missing"):
        CheckpointIndex.open(tmp_path)


def test_missing_tensor_is_reported_before_any_read(tmp_path):
    save_file(_tensors(), tmp_path / SINGLE_FILE)
    reads = CheckpointIndex.open(tmp_path).read({"a.weight", "zz.weight", "yy.weight"})
    with pytest.raises(ValueError, match=r"lacks tensor 'yy.weight' \(2 missing in all\)"):
        next(reads)


# place_weights ------------------------------------------------------------------------------------------

def _sources(seed: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "q": torch.randn(6, 5, generator=g), "k": torch.randn(2, 5, generator=g), "v": torch.randn(3, 5, generator=g),
        **{f"e{i}": torch.randn(3, 5, generator=g) for i in range(3)},
        "norm": torch.randn(5, generator=g),
    }


def _reader(sources: dict[str, torch.Tensor], calls: list[set[str]]):
    def read(keys: set[str]):
        calls.append(set(keys))
        for key in sorted(keys):
            yield key, sources[key]
    return read


def _specs(dtype: torch.dtype = torch.float32) -> list[WeightSpec]:
    return [
        WeightSpec("norm", (5,), dtype, (("norm", ()),)),
        WeightSpec("qkv", (11, 5), dtype, (("q", ((0, 6),)), ("k", ((6, 8),)), ("v", ((8, 11),)))),
        WeightSpec("experts", (3, 3, 5), dtype, tuple((f"e{i}", (i,)) for i in range(3))),
    ]


def test_regions_land_in_place_and_reader_is_called_once():
    sources, calls = _sources(), []
    out = place_weights(_specs(), _reader(sources, calls))
    assert calls == [set(sources)]
    assert torch.equal(out["norm"], sources["norm"])
    assert torch.equal(out["qkv"], torch.cat([sources["q"], sources["k"], sources["v"]]))
    assert torch.equal(out["experts"], torch.stack([sources[f"e{i}"] for i in range(3)]))


def test_one_source_may_fill_two_weights():
    sources = _sources()
    specs = [WeightSpec("embed", (5,), torch.float32, (("norm", ()),)),
             WeightSpec("head", (5,), torch.float32, (("norm", ()),))]
    out = place_weights(specs, _reader(sources, []))
    assert torch.equal(out["embed"], sources["norm"]) and torch.equal(out["head"], sources["norm"])


def test_fp32_sources_convert_to_bf16_weights():
    sources = _sources()
    out = place_weights(_specs(torch.bfloat16), _reader(sources, []))
    assert all(w.dtype == torch.bfloat16 for w in out.values())
    assert torch.equal(out["qkv"], torch.cat([sources["q"], sources["k"], sources["v"]]).to(torch.bfloat16))


def test_tensors_stream_one_at_a_time():
    """place_weights keeps no source after copying it: when the reader makes tensor n, only tensor n - 1
    (still bound to the consumer's loop variable) may be alive."""
    sources, alive, most_alive = _sources(), [], 0

    def read(keys):
        nonlocal most_alive
        for key in sorted(keys):
            most_alive = max(most_alive, sum(ref() is not None for ref in alive))
            tensor = sources[key].clone()
            alive.append(weakref.ref(tensor))
            yield key, tensor
            del tensor

    place_weights(_specs(), read)
    assert len(alive) == len(sources)
    assert most_alive <= 1, f"{most_alive} earlier source tensors still alive when the next was read"


def test_wrong_source_shape():
    sources = {**_sources(), "k": torch.zeros(3, 5)}
    with pytest.raises(ValueError, match=r"'k' has shape \[3, 5\], qkv expects \[2, 5\]"):
        place_weights(_specs(), _reader(sources, []))


def test_unfilled_region():
    specs = [WeightSpec("qkv", (11, 5), torch.float32, (("q", ((0, 6),)), ("v", ((8, 11),))))]
    with pytest.raises(ValueError, match="weight qkv: its checkpoint sources leave a part unfilled"):
        place_weights(specs, _reader(_sources(), []))


def test_region_filled_twice_while_another_is_unfilled():
    specs = [WeightSpec("w", (4, 5), torch.float32, (("e0", ((0, 2),)), ("e1", ((0, 2),))))]
    sources = {"e0": torch.ones(2, 5), "e1": torch.ones(2, 5)}
    with pytest.raises(ValueError, match="weight w"):
        place_weights(specs, _reader(sources, []))


# -- transforms: the form the megakernel reads ------------------------------------------------------------
def test_transform_scales_columns_and_interleaves_halves_in_place():
    w = torch.arange(24, dtype=torch.float32).view(6, 4)
    scale = torch.tensor([1.0, 2.0, 0.5, -1.0])
    expected = torch.stack((w[:3], w[3:]), dim=1).reshape(6, 4) * scale
    transform_weight(w, w, scale, interleave_rows=True, chunk_rows=4)  # chunks cut across moved rows
    assert torch.equal(w, expected)


def test_transform_interleaves_each_stacked_matrix_apart():
    """An MoE gate/up weight, [experts, 2I, hidden]: each expert's gate and up rows interleave within it."""
    w = torch.arange(2 * 6 * 3, dtype=torch.float32).view(2, 6, 3)
    scale = torch.tensor([1.0, 2.0, -1.0])
    expected = torch.stack([torch.stack((m[:3], m[3:]), dim=1).reshape(6, 3) * scale for m in w])
    transform_weight(w, w, scale, interleave_rows=True, chunk_rows=4)
    assert torch.equal(w, expected)


def test_transform_into_a_copy_leaves_the_source():
    src = torch.randn(5, 3).to(torch.bfloat16)
    scale = torch.randn(3).to(torch.bfloat16)
    dst = torch.empty_like(src)
    before = src.clone()
    transform_weight(dst, src, scale)
    assert torch.equal(src, before)
    assert torch.equal(dst, (src.float() * scale.float()).to(torch.bfloat16))  # rounded once
    with pytest.raises(ValueError, match="cannot interleave the halves of 5 rows"):
        transform_weight(dst, src, interleave_rows=True)
