"""Runtime: weight placement, KV pages, step inputs; later the artifact loader and the kernel launch.

Nothing here imports `ir`, `codegen` or `models`: the runtime works from plain tables (weight specs,
manifests) so it can load an artifact without the model definition.
"""
