"""The Gluon kernels of every artifact in Blink's cache, compiled (again) into it for 132 SMs: what `blinkc compile`
does beside a kernel's compile (`GluonCoverage.one_request_launches`, here whether or not the one-row loop takes the
kernel), and the batched loop's (`GluonCoverage.batch_launches`), for artifacts the cache already holds, whose Gluon
kernels an edit under codegen/gluon has made stale (their keys hold its source; the artifacts' do not). With
--traced, the batched loop's traced kernels too, and with --probes, its PROBE variants (traced where --traced), as
`chain_probe.py` launches them: the variants a device run times, compiled here.

    BLINK_CACHE_DIR=.blink-cache/c68 python -m benchmarks.explore.precompile_gluon [--traced] [--probes 4,16] \
        [--variants-of 1ab05c] [--paths]

--paths prints each kernel's directory in the cache: a device run's carry is 64 MB, so a run that compares working
trees carries only the kernels it launches.
"""
from __future__ import annotations

import argparse
import json
import time

from benchmarks.explore.carry import coverage_of
from blinkc.env import cache_dir
from runtime import gluon_kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traced", action="store_true", help="the batched loop's traced kernels too (greedy)")
    parser.add_argument("--probes", default="", help="the batched loop's PROBE variants too (greedy), e.g. 1,4")
    parser.add_argument("--variants-of", default="", help="those variants for the artifacts whose key starts so only "
                        "(a device run's carry is 64 MB)")
    parser.add_argument("--paths", action="store_true", help="print each kernel's directory in the cache")
    args = parser.parse_args()
    probes = [0] + [int(v) for v in args.probes.split(",") if v]

    for manifest_path in sorted((cache_dir() / "artifacts").glob("*/model.cubin.json")):
        manifest = json.loads(manifest_path.read_text())
        if manifest["model"].get("dtype") != "bf16" or manifest["config"].get("interpret"):
            continue
        start = time.perf_counter()
        coverage = coverage_of(manifest_path)
        launches = coverage.one_request_launches() + coverage.batch_launches()  # (the prefill's whatever the loop)
        chosen = manifest_path.parent.name.startswith(args.variants_of)
        for tracing in (False, True) if args.traced and chosen else (False, ):
            for probe in probes if chosen else probes[:1]:
                coverage.tracing, coverage.batch_probe = tracing, probe
                launches += coverage.batch_launches()[:1] if (tracing or probe) else []
        paths = [gluon_kernels.precompile(*launch) for launch in launches]
        print(f"{manifest_path.parent.name}: {len(paths)} Gluon kernels in {time.perf_counter() - start:.0f} s",
              flush=True)
        if args.paths:
            print("\n".join(sorted({str(path) for path in paths})), flush=True)


if __name__ == "__main__":
    main()
