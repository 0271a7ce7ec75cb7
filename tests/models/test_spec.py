"""specls.json validation, FIM templates and the tokenizer wrapper (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specls.models.fim import (
    BUNDLED,
    CODELLAMA,
    DEEPSEEK_CODER,
    PRESETS,
    QWEN25_CODER,
    STARCODER,
    FimTemplate,
    detect_template,
    fim_prompt_text,
)
from specls.models.spec import (
    SPEC_FILE,
    GraphIO,
    ModelLoadError,
    ModelSpec,
    check_graph_io,
    kv_names,
    load_spec,
)
from specls.models.tokenizer import IncrementalDecoder, Tokenizer

from .conftest import build_tokenizer


def make_spec(**over: object) -> ModelSpec:
    pk, pv, ok, ov = kv_names(2)
    base: dict[str, object] = dict(
        model_type="llama",
        architecture="LlamaForCausalLM",
        vocab_size=300,
        num_layers=2,
        num_kv_heads=2,
        head_dim=8,
        hidden_size=32,
        dtype="fp32",
        onnx_file="model.onnx",
        tokenizer_file="tokenizer.json",
        input_names=("input_ids", "attention_mask", "position_ids"),
        past_key_names=pk,
        past_value_names=pv,
        present_key_names=ok,
        present_value_names=ov,
        logits_name="logits",
        eos_token_ids=(3,),
        fim=BUNDLED,
        max_context=256,
    )
    base.update(over)
    return ModelSpec(**base)  # type: ignore[arg-type]


def write_dir(tmp_path: Path, spec: ModelSpec) -> Path:
    spec.write(tmp_path)
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def test_spec_roundtrip(tmp_path: Path) -> None:
    spec = make_spec()
    d = write_dir(tmp_path, spec)
    assert load_spec(d) == spec


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("format_version", 99, "format_version"),
        ("num_layers", 0, "num_layers"),
        ("dtype", "int4", "dtype"),
        ("past_key_names", ["past_key_values.0.key"], "past_key_names"),
        ("input_names", ["input_ids"], "attention_mask"),
        ("kv_layout", "batch,seq,kv_heads,head_dim", "kv_layout"),
        ("eos_token_ids", [1000], "eos_token_ids"),
        ("onnx_file", "../model.onnx", "onnx_file"),
        ("fim", {"family": "x"}, "fim.prefix"),
        ("batch_onnx_file", "sub/model.batch.onnx", "batch_onnx_file"),
        ("batch_onnx_file", 3, "batch_onnx_file"),
        ("shared_kv_buffer", "yes", "shared_kv_buffer"),  # Not truthy: a bool
    ],
)
def test_spec_bad_field(tmp_path: Path, field: str, value: object, needle: str) -> None:
    d = write_dir(tmp_path, make_spec())
    raw = json.loads((d / SPEC_FILE).read_text())
    raw[field] = value
    (d / SPEC_FILE).write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError) as ei:
        load_spec(d)
    assert SPEC_FILE in str(ei.value) and needle in str(ei.value)


def test_spec_logits_to_keep_input() -> None:
    spec = make_spec(input_names=("input_ids", "attention_mask", "position_ids", "logits_to_keep"))
    assert spec.keeps_logits and not make_spec().keeps_logits
    ins, outs = _io(make_spec())
    keep = GraphIO("logits_to_keep", "tensor(int64)", (1,))
    check_graph_io(spec, Path("m.onnx"), [*ins, keep], outs)
    with pytest.raises(ModelLoadError, match="logits_to_keep"):  # Not a [batch, seq] input
        check_graph_io(spec, Path("m.onnx"), [*ins, GraphIO("logits_to_keep", "tensor(int64)", (1, 1))], outs)
    with pytest.raises(ModelLoadError, match="does not name"):  # in the graph but not in specls.json
        check_graph_io(make_spec(), Path("m.onnx"), [*ins, keep], outs)


def test_spec_batch_graph(tmp_path: Path) -> None:
    spec = make_spec(batch_onnx_file="model.batch.onnx")
    d = write_dir(tmp_path, spec)
    with pytest.raises(ModelLoadError, match="model.batch.onnx"):  # named but missing
        load_spec(d)
    (d / "model.batch.onnx").write_bytes(b"x")
    assert load_spec(d) == spec
    (tmp_path / "plain").mkdir()
    assert load_spec(write_dir(tmp_path / "plain", make_spec())).batch_onnx_file is None


def test_spec_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="specls.json"):
        load_spec(tmp_path)
    with pytest.raises(ModelLoadError, match="not a model directory"):
        load_spec(tmp_path / "nope")
    d = write_dir(tmp_path, make_spec())
    (d / "model.onnx").unlink()
    with pytest.raises(ModelLoadError, match="model.onnx"):
        load_spec(d)
    (d / SPEC_FILE).write_text("{not json")
    with pytest.raises(ModelLoadError, match="unreadable JSON"):
        load_spec(d)


def _io(spec: ModelSpec) -> tuple[list[GraphIO], list[GraphIO]]:
    ins = [GraphIO(n, "tensor(int64)", ("batch", "new")) for n in spec.input_names]
    ins += [GraphIO(n, "tensor(float)", ("batch", 2, "past", 8)) for n in spec.graph_inputs[3:]]
    outs = [GraphIO("logits", "tensor(float)", ("batch", "new", 300))]
    outs += [GraphIO(n, "tensor(float)", ("batch", 2, "p", 8)) for n in spec.graph_outputs[1:]]
    return ins, outs


def test_check_graph_io() -> None:
    spec = make_spec()
    ins, outs = _io(spec)
    check_graph_io(spec, Path("m.onnx"), ins, outs)  # consistent: no error
    with pytest.raises(ModelLoadError, match="lacks inputs"):
        check_graph_io(spec, Path("m.onnx"), ins[:-1], outs)
    with pytest.raises(ModelLoadError, match="vocab"):
        check_graph_io(
            spec, Path("m.onnx"), ins, [GraphIO("logits", "tensor(float)", (1, 1, 301)), *outs[1:]]
        )
    bad = [*ins[:3], GraphIO(ins[3].name, "tensor(float)", ("batch", 4, "past", 8)), *ins[4:]]
    with pytest.raises(ModelLoadError, match="past_key_values.0.key"):
        check_graph_io(spec, Path("m.onnx"), bad, outs)
    with pytest.raises(ModelLoadError, match="float16"):
        check_graph_io(make_spec(dtype="fp16"), Path("m.onnx"), ins, outs)


def test_detect_template() -> None:
    for t in (QWEN25_CODER, DEEPSEEK_CODER, CODELLAMA):
        assert detect_template(set(t.special_tokens) | {"a", "b"}) == t
    assert detect_template(set(BUNDLED.special_tokens)) == BUNDLED
    assert detect_template(set(STARCODER.special_tokens) | {"<fim_pad>"}) == STARCODER
    assert detect_template({"a", "b", "<fim_prefix>"}) is None
    assert set(PRESETS) == {"starcoder", "qwen2.5-coder", "deepseek-coder", "codellama", "bundled"}
    assert BUNDLED.order == "spm" and all(PRESETS[f].order == "psm" for f in PRESETS if f != "bundled")


def test_fim_prompt_text_orders() -> None:
    q = fim_prompt_text(QWEN25_CODER, "def f(", "):\n", context_files=[("a.py", "x = 1")])
    assert q == "<|file_sep|>a.py\nx = 1\n<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"
    b = fim_prompt_text(BUNDLED, "def f(", "):\n")
    assert b == "<fim_prefix><fim_suffix>):\n<fim_middle>def f("
    # spm: typing at the cursor only appends to the prompt
    assert fim_prompt_text(BUNDLED, "def f(x", "):\n").startswith(b)
    # no file separator: context files are dropped
    assert fim_prompt_text(CODELLAMA, "p", "s", [("a", "b")]) == "<PRE>p<SUF>s<MID>"


def test_fim_dict_roundtrip() -> None:
    for t in PRESETS.values():
        assert FimTemplate.from_dict(t.to_dict()) == t
    with pytest.raises(ValueError, match="order"):
        FimTemplate.from_dict({**BUNDLED.to_dict(), "order": "xyz"})


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_file(build_tokenizer(tmp_path_factory.mktemp("tok")))


def test_tokenizer_basics(tok: Tokenizer) -> None:
    text = "def add(a, b):\n    return a + b\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    fp = tok.token_to_id("<fim_prefix>")
    assert fp is not None and fp in tok.special_ids
    assert tok.encode("<fim_prefix>x")[0] == fp
    assert tok.vocab_size <= 300 and tok.token_to_id("no-such-token") is None


def test_decode_suffix_split_chars(tok: Tokenizer) -> None:
    text = "x = 'naïve café 日本語 ✓'\nprint(x)"
    ids = tok.encode(text)
    # some token holds only part of a multi-byte char
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    for k in range(len(ids) + 1):
        head = tok.decode_suffix(ids[:k], 0)
        assert head + tok.decode_suffix(ids, k) == text
    dec = IncrementalDecoder(tok)
    pieces = [dec.push([i]) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
