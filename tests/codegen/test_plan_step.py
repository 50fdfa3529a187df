"""The step planner (codegen/bodies/schedule.py, `plan_step`) alone under TRITON_INTERPRET=1, against the plan a
loop over the requests in order makes: finished requests, decoding ones, a prompt's last token, prompt chunks, a
token budget that runs out part way through a request and leaves the later ones out. The same test runs compiled
where a GPU is (marked `gpu`)."""
from __future__ import annotations

import os
import random

import pytest
import torch
import triton

from codegen.bodies.schedule import plan_step
from codegen.layout import CONTROL_FIELDS, Layout, add_step_regions

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = [pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                 reason="needs the interpreter or a GPU"),
              *([] if INTERPRET else [pytest.mark.gpu])]

R, P, M, PAGE = 8, 6, 40, 8  # requests, pages a request, prompt room a request, keys a page
STEP = 5


def layout(max_tokens: int) -> Layout:
    lay = Layout()
    add_step_regions(lay, T=max_tokens, B=R, R=R, P=P, M=M, O=4)
    return lay


def serial_plan(requests: list[dict], max_tokens: int) -> dict:
    """The step a loop over the requests in order plans: each unfinished one takes its next prompt chunk, or its
    last sampled token, of what is left of the budget."""
    tokens, seqs, cached_after, active = [], [], {}, 0
    for r, q in enumerate(requests):
        if q["finished"]:
            continue
        active += 1
        n = min(max(q["prompt_len"] - q["cached"], 1), max_tokens - len(tokens))
        if n <= 0:
            continue
        t = len(tokens)
        for pos in range(q["cached"], q["cached"] + n):
            token = q["prompt"][pos] if pos < q["prompt_len"] else q["last"]
            tokens.append((token, pos, q["pages"][pos // PAGE] * PAGE + pos % PAGE))
        seqs.append((t, q["cached"] + n, r, t + n - 1, int(q["cached"] + n >= q["prompt_len"])))
        cached_after[r] = q["cached"] + n
    return dict(tokens=tokens, seqs=seqs, cached=cached_after, done=int(active == 0))


def random_requests(generator: random.Random, num: int) -> list[dict]:
    requests = []
    for r in range(num):
        prompt_len = generator.randint(1, M)
        cached = generator.choice([0, generator.randint(0, prompt_len), prompt_len - 1, prompt_len,
                                   prompt_len + generator.randint(1, 7)])
        requests.append(dict(finished=generator.random() < 0.2, prompt_len=prompt_len, cached=cached,
                             prompt=[generator.randint(1, 999) for _ in range(prompt_len)],
                             last=generator.randint(1, 999), pages=generator.sample(range(100), P)))
    return requests


@pytest.mark.parametrize("max_tokens", [7, 64])  # the budget runs out part way, or holds every request
@pytest.mark.parametrize("seed", range(4))
def test_the_plan_is_the_requests_taken_in_order(seed, max_tokens):
    generator = random.Random(seed)
    requests = random_requests(generator, generator.randint(1, R))
    lay = layout(max_tokens)
    at = {name: region.offset for name, region in lay.regions.items()}
    i32 = torch.full((lay.sizes["I32"],), -7, dtype=torch.int32)
    i32[at["control"] + CONTROL_FIELDS.index("num_requests")] = len(requests)
    for r, q in enumerate(requests):
        for name, value in (("req_finished", int(q["finished"])), ("req_cached", q["cached"]),
                            ("req_prompt_len", q["prompt_len"]), ("req_prompt_off", r * M), ("req_last", q["last"])):
            i32[at[name] + r] = value
        i32[at["prompts"] + r * M:at["prompts"] + r * M + q["prompt_len"]] = torch.tensor(q["prompt"])
        i32[at["req_pages"] + r * P:at["req_pages"] + (r + 1) * P] = torch.tensor(q["pages"])
    i32 = i32.to(DEVICE)
    f32 = torch.ones(16, device=DEVICE)
    plan_step[(1,)](i32, f32, STEP, *(at[name] for name in (  # a jit function that returns nothing: a kernel too
        "control", "input_ids", "positions", "slots", "seq_starts", "context_lens", "seq_req", "logits_rows",
        "seq_final", "req_prompt_off", "req_prompt_len", "req_cached", "req_finished", "req_last", "req_pages",
        "prompts")), P, PAGE, max_tokens, 0, 16, 16, triton.next_power_of_2(R))  # statistics: F32[0:16]
    out = i32.cpu()
    expected = serial_plan(requests, max_tokens)
    control = {name: int(out[at["control"] + i]) for i, name in enumerate(CONTROL_FIELDS)}
    num_tokens, num_seqs = len(expected["tokens"]), len(expected["seqs"])
    assert (control["num_tokens"], control["num_seqs"], control["done"], control["step"]) == (
        num_tokens, num_seqs, expected["done"], STEP)
    region = lambda name, n: out[at[name]:at[name] + n].tolist()  # noqa: E731
    assert list(zip(region("input_ids", num_tokens), region("positions", num_tokens),
                    region("slots", num_tokens))) == expected["tokens"]
    assert list(zip(region("seq_starts", num_seqs), region("context_lens", num_seqs), region("seq_req", num_seqs),
                    region("logits_rows", num_seqs), region("seq_final", num_seqs))) == expected["seqs"]
    assert out[at["seq_starts"] + num_seqs] == num_tokens
    assert region("req_cached", len(requests)) == [expected["cached"].get(r, q["cached"])
                                                   for r, q in enumerate(requests)]
    assert f32[:16].cpu().eq(0).all()  # the statistics zeroed
