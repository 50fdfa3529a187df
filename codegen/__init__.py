"""codegen: lowering the IR to tasks and events, rendering the persistent Triton megakernel, compiling it."""
