"""Runtime: weight placement, KV pages, step inputs, sampling, the artifact loader and the kernel launch.

Nothing here imports `models`: the runtime works from plain tables (weight specs, manifests) so it can load
an artifact without the model definition. Of `codegen` it takes only the kernel's ABI (the control words'
layout, the launch's task schedule) and of `ir` the rotary angles' reference, both shared with the compiler.
"""
