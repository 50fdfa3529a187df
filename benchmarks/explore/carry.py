"""A device run's carry, assembled from Blink's cache: for each artifact named (by the start of its key), its kernel's
cubin, its host-driven kernels and the Gluon kernels the run launches, copied into DEST/cubins. A run's carry is
64 MiB, and a session's cache holds several times that; a run pointed at DEST (`BLINK_CACHE_DIR`) rebuilds each
artifact from its cubin in seconds. The Gluon kernels are compiled into the cache first where they are missing (as
`precompile_gluon.py` does; their keys hold codegen/'s source, so run this from the tree the device will run).

    BLINK_CACHE_DIR=.blink-cache/c78 python -m benchmarks.explore.carry .blink-cache/r1 9ccdf6:batch,traced 211bb8:one

What an artifact's run launches: `one` (`GluonCoverage.one_request_launches`: one request through the runtime),
`batch` (the batched loop, greedy and sampling: a batch through the runtime, the host-driven executor's batched
steps), `traced` (the batched loop's greedy kernel traced: `chain_probe.py`), `probeN` (its PROBE N variant traced:
`chain_probe.py --probes N`); none: the kernel and its host-driven kernels alone (the compiled kernel's runs).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

from blinkc.build import HOPPER_SMS
from blinkc.env import cache_dir
from runtime import gluon_kernels
from runtime.artifact import Artifact
from runtime.gluon import GluonCoverage
from runtime.host_driven import _inlined, contiguous_groups, host_folder

KINDS = ("one", "batch", "traced")


def coverage_of(manifest_path: Path) -> GluonCoverage:
    """The Gluon bodies' coverage of the cached artifact whose manifest is at manifest_path, on HOPPER_SMS SMs."""
    from safetensors.torch import load_file

    manifest = json.loads(manifest_path.read_text())
    tables = load_file(manifest_path.with_name("model.cubin.tables.safetensors"))
    regions = manifest["layout"]["regions"]
    room = tuple(regions[name][2] if name in regions else 0 for name in ("prefill_parts", "tickets:prefill"))
    return GluonCoverage(tables["tasks"], tables["descs"].tolist(), SimpleNamespace(**manifest["config"]),
                         contiguous_groups(tables["tasks"][:, 3].tolist()), HOPPER_SMS, room)


def launches(manifest_path: Path, kinds: set[str]) -> list[tuple]:
    """The Gluon launches of `kinds` for the artifact whose manifest is at manifest_path."""
    coverage = coverage_of(manifest_path)
    chosen = coverage.one_request_launches() if "one" in kinds else []
    chosen += coverage.batch_launches() if "batch" in kinds else []
    if "traced" in kinds:
        coverage.tracing = True
        chosen += coverage.batch_launches()[:1]
    for probe in sorted(int(kind[5:]) for kind in kinds if kind.startswith("probe")):
        coverage.tracing, coverage.batch_probe = True, probe  # (as `chain_probe --probes` launches them)
        chosen += coverage.batch_launches()[:1]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", type=Path, help="the carry's folder (replaced): the run's BLINK_CACHE_DIR")
    parser.add_argument("artifacts", nargs="+", help="KEY[:one,batch,traced], KEY the start of an artifact's key")
    args = parser.parse_args()
    cache, out = cache_dir(), args.dest / "cubins"
    shutil.rmtree(args.dest, ignore_errors=True)
    out.mkdir(parents=True)
    for spec in args.artifacts:
        prefix, _, what = spec.partition(":")
        kinds = set(filter(None, what.split(",")))
        if {kind for kind in kinds if not kind[5:].isdigit() or not kind.startswith("probe")} - set(KINDS):
            raise SystemExit(f"{spec}: what a run launches is one of {', '.join(KINDS)} or probeN")
        found = sorted((cache / "artifacts").glob(f"{prefix}*/model.cubin.json"))
        if len(found) != 1:
            raise SystemExit(f"{prefix}: {len(found)} artifacts in {cache} start so, not one")
        key = found[0].parent.name
        folders = [cache / "cubins" / key]
        artifact = Artifact.load(found[0].with_suffix(""))
        host, there = host_folder(_inlined(artifact.source_path), 90)
        if not there:
            raise SystemExit(f"{key}: its host-driven kernels are not in {cache} (`runtime.host_driven.precompile`)")
        folders.append(host)
        folders += [gluon_kernels.precompile(*launch) for launch in launches(found[0], kinds)]
        for folder in folders:
            if not (out / folder.name).exists():
                shutil.copytree(folder, out / folder.name)
        print(f"{key} ({artifact.manifest['model']['name']}, max_batch {artifact.manifest['config']['max_batch']}): "
              f"{len(folders)} folders", flush=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{args.dest}: {size / 2**20:.1f} MiB (a run's carry holds 64)")


if __name__ == "__main__":
    main()
