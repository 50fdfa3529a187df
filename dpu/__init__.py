"""The frontend (the role a DPU plays): HTTP API, tokenizer, chat templates, transports.

Never imports ir, codegen or models: it must run on a machine with no GPU stack.
"""
