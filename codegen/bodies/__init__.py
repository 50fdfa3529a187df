"""Task bodies: Triton device functions the megakernel calls, one module per task kind.

Each body reads its operands from a descriptor row (int64 words, laid out by the `*_FIELDS` tuple next
to it) and the step's metadata, and is unit-tested on its own against the op's reference implementation.
"""
