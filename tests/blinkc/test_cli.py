"""`blinkc` and `blink` in process: inspect, weights --random, generate, chat; every user error is one
stderr line and exit code 2."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from blinkc import cli, serve_cli
from dpu.tokenizer import Tokenizer
from models.presets import FULL_PRESETS, preset_config
from runtime.checkpoint import INDEX_FILE, CheckpointIndex

PARAMETERS = {  # the public parameter counts of the full-size models, and their bf16 bytes
    "llama3-8b": "8.030 B (16.06 GB)", "phi-4": "14.660 B (29.32 GB)", "qwen3-32b": "32.762 B (65.52 GB)",
    "qwen3-30b-a3b": "30.532 B (61.06 GB)",
}
PROMPT = "The quick brown fox"


def _run(capsys, main, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_error_line(code: int, err: str, prefix: str = "blinkc: error:") -> str:
    assert code == 2
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), f"stderr: {err!r}"
    return lines[0]


def _config_dir(tmp_path, name: str = "model", text: str | None = None, **fields):
    """A directory holding only a config.json: tiny-llama's with `fields` replaced, or `text` verbatim."""
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text(text if text is not None else json.dumps({**preset_config("tiny-llama"),
                                                                                      **fields}))
    return directory


@pytest.mark.parametrize("preset", FULL_PRESETS)
def test_inspect_full_presets(capsys, preset):
    code, out, err = _run(capsys, cli.main, ["inspect", preset])
    assert code == 0 and err == ""
    assert f"parameters  {PARAMETERS[preset]}" in out
    assert "preset, no weights" in out and "decode      batch 1, context 512:" in out


def test_inspect_roofline(capsys):
    code, out, _ = _run(capsys, cli.main, ["inspect", "llama3-8b", "--bandwidth", "4.49"])
    assert code == 0
    assert "roofline    3.36 ms per step at 4.49 TB/s" in out


def test_inspect_checkpoint_dir_and_graph(capsys, checkpoint):
    directory = checkpoint("tiny-llama")
    code, out, _ = _run(capsys, cli.main, ["inspect", str(directory), "--graph", "--batch", "3", "--context", "37"])
    assert code == 0
    assert f"checkpoint {directory}" in out
    assert "3 layers, hidden 96, heads 6/2 kv x 16, vocab 1003, bf16" in out
    assert "decode      batch 3, context 37:" in out
    node_lines = [line for line in out.splitlines() if re.match(r"  %\d+(, %\d+)* = \w+\(", line)]
    assert len(node_lines) > 20
    assert any("paged_attention(" in line for line in node_lines)
    assert "  return logits = %" in out


def test_weights_random_writes_a_sharded_checkpoint(capsys, tmp_path):
    out_dir = tmp_path / "qwen"
    code, out, _ = _run(capsys, cli.main, ["weights", "--random", "tiny-qwen3", str(out_dir),
                                            "--max-shard-size", "100000"])
    assert code == 0 and str(out_dir) in out
    for name in ("config.json", "generation_config.json", INDEX_FILE, "tokenizer.json", "tokenizer_config.json"):
        assert (out_dir / name).is_file(), name
    assert json.loads((out_dir / "config.json").read_text()) == preset_config("tiny-qwen3")
    shards = CheckpointIndex.open(out_dir).shards()
    assert len(shards) >= 3
    assert sorted(p.name for p in out_dir.glob("*.safetensors")) == shards
    assert not list(out_dir.glob("*.tmp"))


def test_generate_json_prints_the_ids(capsys, checkpoint):
    directory = str(checkpoint("tiny-qwen3"))
    code, out, _ = _run(capsys, cli.main, ["generate", directory, "--prompt", PROMPT, "--max-tokens", "5", "--json"])
    assert code == 0
    ids = json.loads(out)
    assert len(ids) == 5 and all(isinstance(i, int) and 0 <= i < 1009 for i in ids)
    code, text, _ = _run(capsys, cli.main, ["generate", directory, "--prompt", PROMPT, "--max-tokens", "5"])
    assert code == 0 and text == Tokenizer.from_dir(directory).decode(ids) + "\n"


def test_generate_chat(capsys, checkpoint):
    directory = str(checkpoint("tiny-qwen3"))
    code, out, _ = _run(capsys, cli.main, ["generate", directory, "--prompt", PROMPT, "--max-tokens", "5",
                                            "--json", "--chat", "--dtype", "f32"])
    assert code == 0
    ids = json.loads(out)
    assert 1 <= len(ids) <= 5 and all(isinstance(i, int) for i in ids)


def test_generate_random_weights_writes_the_cache_once(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE_DIR", str(tmp_path / "cache"))
    argv = ["generate", "tiny-phi", "--random-weights", "--prompt", PROMPT, "--max-tokens", "3", "--json"]
    code, first, _ = _run(capsys, cli.main, argv)
    assert code == 0 and (tmp_path / "cache" / "random" / "tiny-phi-seed0" / "config.json").is_file()
    code, again, _ = _run(capsys, cli.main, argv)
    assert code == 0 and json.loads(first) == json.loads(again)


def test_chat_message(capsys, checkpoint):
    code, out, err = _run(capsys, serve_cli.main, ["chat", str(checkpoint("tiny-qwen3")), "--message", "hello there",
                                                   "--max-tokens", "6"])
    assert code == 0 and err == ""
    assert out.strip()


def test_chat_random_weights(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE_DIR", str(tmp_path))
    code, out, _ = _run(capsys, serve_cli.main, ["chat", "tiny-llama", "--random-weights", "--message", "hi",
                                                 "--max-tokens", "4"])
    assert code == 0 and out.endswith("\n")


# user errors --------------------------------------------------------------------------------------------

LONGROPE = {"rope_type": "longrope", "long_factor": [1.0] * 8, "short_factor": [1.0] * 8}
USER_ERRORS = {  # case -> (argv given a tmp_path, what the error line must say)
    "unknown-preset": (lambda tmp: ["inspect", "llama9-1t"], "neither a preset"),
    "unknown-preset-weights": (lambda tmp: ["weights", "--random", "llama9-1t", str(tmp / "out")],
                               "unknown preset 'llama9-1t'"),
    "missing-directory": (lambda tmp: ["generate", str(tmp / "absent"), "--prompt", PROMPT],
                          "absent: neither a preset"),
    "malformed-json": (lambda tmp: ["inspect", str(_config_dir(tmp, text='{"architectures": ["LlamaForCausalLM"],'))],
                       "config.json: malformed JSON"),
    "json-not-an-object": (lambda tmp: ["inspect", str(_config_dir(tmp, text="[1, 2]"))], "expected a JSON object"),
    "unsupported-architecture": (lambda tmp: ["inspect", str(_config_dir(tmp, architectures=["GPT2LMHeadModel"]))],
                                 "unsupported architecture 'GPT2LMHeadModel'"),
    "unsupported-rope": (lambda tmp: ["inspect", str(_config_dir(tmp, rope_scaling=LONGROPE))],
                         "rope type 'longrope' is not supported"),
    "wrong-type-int": (lambda tmp: ["inspect", str(_config_dir(tmp, hidden_size="96"))],
                       "hidden_size must be int, got '96'"),
    "wrong-type-float": (lambda tmp: ["inspect", str(_config_dir(tmp, rms_norm_eps="tiny"))],
                         "rms_norm_eps must be float"),
    "bad-inspect-option": (lambda tmp: ["inspect", "tiny-llama", "--context", "0"],
                           "--context and --batch must be at least 1"),
    "pre-hopper-arch": (lambda tmp: ["compile", "tiny-llama", "--random-weights", "--arch", "80", "-o",
                                     str(tmp / "m.cubin")], "needs sm_90 or newer"),
    "random-weights-missing-dir": (lambda tmp: ["generate", str(tmp / "absent"), "--random-weights",
                                                "--prompt", PROMPT], "--random-weights needs a preset"),
}


@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_user_error_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch, case):
    monkeypatch.setenv("BLINK_CACHE_DIR", str(tmp_path / "cache"))
    make_argv, message = USER_ERRORS[case]
    code, out, err = _run(capsys, cli.main, make_argv(tmp_path))
    assert message in _assert_one_error_line(code, err)
    assert out == ""


def test_generate_option_errors(capsys, checkpoint):
    directory = str(checkpoint("tiny-qwen3"))
    code, _, err = _run(capsys, cli.main, ["generate", directory, "--prompt", PROMPT, "--max-tokens", "0"])
    assert "max_tokens must be at least 1" in _assert_one_error_line(code, err)
    code, _, err = _run(capsys, cli.main, ["generate", directory, "--prompt", PROMPT, "--max-tokens", "600"])
    assert "exceeds max_model_len (512)" in _assert_one_error_line(code, err)


BAD_CONFIG_FIELDS = {  # each must be caught as a config error, not escape as a traceback
    "rope_theta-list": {"rope_theta": [500000.0], "rope_scaling": None},
    "rope_theta-null": {"rope_theta": None, "rope_scaling": None},
    "torch_dtype-list": {"torch_dtype": ["bfloat16"]},
    "partial_rotary_factor-null": {"partial_rotary_factor": None},
    "partial_rotary_factor-text": {"partial_rotary_factor": "x"},
    "num_attention_heads-zero": {"num_attention_heads": 0},
    "eos_token_id-text": {"eos_token_id": ["x"]},
    "intermediate_size-negative": {"intermediate_size": -1},
    "max_position_embeddings-zero": {"max_position_embeddings": 0},
}


@pytest.mark.parametrize("case", list(BAD_CONFIG_FIELDS))
def test_bad_config_field_is_a_user_error(capsys, tmp_path, case):
    code, _, err = _run(capsys, cli.main, ["inspect", str(_config_dir(tmp_path, **BAD_CONFIG_FIELDS[case]))])
    assert "config.json" in _assert_one_error_line(code, err)


def test_random_weights_of_a_directory_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BLINK_CACHE_DIR", str(tmp_path / "cache"))
    directory = _config_dir(tmp_path, name="ckpt")
    code, _, err = _run(capsys, cli.main, ["generate", str(directory), "--random-weights", "--prompt", PROMPT])
    assert "--random-weights needs a preset" in _assert_one_error_line(code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"], "files written outside the checkpoint"


def test_chat_errors(capsys, tmp_path):
    code, _, err = _run(capsys, serve_cli.main, ["chat", "llama9-1t", "--random-weights", "--message", "hi"])
    assert "--random-weights needs a preset" in _assert_one_error_line(code, err, prefix="blink: error:")
    code, _, err = _run(capsys, serve_cli.main, ["chat", "llama3-8b", "--message", "hi"])
    assert "needs weights" in _assert_one_error_line(code, err, prefix="blink: error:")


def test_console_script_help():
    blinkc = shutil.which("blinkc")
    assert blinkc, "the blinkc console script is not installed (pip install -e .)"
    result = subprocess.run([blinkc, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert all(command in result.stdout for command in ("inspect", "weights", "generate"))
