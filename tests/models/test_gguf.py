"""GGUF input: a tiny GGUF the test writes itself -> ``specls export`` -> ``specls complete``, and
speculative == plain greedy on the exported graph.

Two files: a Llama with no FIM tokens (F32; the model gets prefix-only prompts) and a Qwen2 whose
vocabulary has Qwen's three FIM tokens but no ``<|file_sep|>`` (Q8_0 weights, dequantized on load).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from specls.decoder.margin import describe_margin, first_difference, plain_greedy_margin
from specls.models.export import ExportError, ExportOptions, export_model, read_report
from specls.models.spec import load_spec
from specls.models.tokenizer import Tokenizer

from specls.api import CompletionRequest
from specls.cli import main
from specls.engine import EngineSettings, OnnxEngine
from tests.models.tiny_gguf import NO_FIM, QWEN_PARTIAL_FIM, TinyGguf, write_tiny_gguf

pytestmark = pytest.mark.slow

SOURCE = (
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n"
)
# (prefix end, suffix start) cut points in SOURCE: the cursor, and the text after it
CUTS = [(len("def add(a, b):\n    return"), len("def add(a, b):\n    return a + b\n")), (40, 40), (60, 70)]


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyGguf]:
    root = tmp_path_factory.mktemp("gguf")
    (root / "llama").mkdir()
    (root / "qwen2").mkdir()
    return {
        "llama": write_tiny_gguf(root / "llama" / "tiny-llama.gguf", "llama", NO_FIM, seed=0),
        "qwen2": write_tiny_gguf(root / "qwen2" / "tiny-qwen2.gguf", "qwen2", QWEN_PARTIAL_FIM, 1, True),
    }


@pytest.fixture(scope="module")
def exported_gguf(ggufs: dict[str, TinyGguf], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """arch -> model dir exported from the GGUF (the Llama by file path, the Qwen2 by its directory)."""
    root = tmp_path_factory.mktemp("gguf-onnx")
    opts = ExportOptions(tolerance=1e-4)
    return {
        "llama": export_model(str(ggufs["llama"].path), root / "llama", opts),
        "qwen2": export_model(str(ggufs["qwen2"].path.parent), root / "qwen2", opts),
    }


def test_written_gguf_loads_as_the_model_it_was_written_from(ggufs: dict[str, TinyGguf]) -> None:
    """The test's own writer is right (names, Llama's Q/K permutation, Q8_0 blocks): transformers'
    GGUF loader gives back the source model's logits."""
    import torch
    from specls.models.gguf import load_gguf_model

    ids = torch.tensor([[5, 17, 33, 100, 250, 7, 8, 42]])
    for arch, g in ggufs.items():
        model, _ = load_gguf_model(g.path, torch.float32, "sdpa")
        with torch.no_grad():
            want, got = g.model(ids).logits, model(ids).logits
        if arch == "llama":  # F32: exact up to float rounding (a wrong Q/K permutation gives ~1)
            assert (want - got).abs().max().item() < 1e-5
        else:  # Q8_0: within quantization error, same argmax
            assert (want - got).abs().max().item() < 0.1
            assert torch.equal(want.argmax(-1), got.argmax(-1))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_export_spec_tokenizer_and_verify(
    exported_gguf: dict[str, Path], ggufs: dict[str, TinyGguf], arch: str
) -> None:
    d = exported_gguf[arch]
    spec = load_spec(d)
    assert spec.model_type == arch and spec.vocab_size == 300 and spec.num_layers == 2
    assert spec.max_context == 256  # the GGUF's context_length
    assert 0 in spec.eos_token_ids  # tokenizer.ggml.eos_token_id
    if arch == "llama":
        assert spec.fim is None  # no FIM tokens: prefix-only prompts, not a refusal
    else:
        assert spec.fim is not None and spec.fim.family == "qwen2.5-coder"
        assert spec.fim.file_sep is None and spec.fim.repo_name is None  # Not "<|file_sep|>": absent
    # tokenizer.json built from the GGUF metadata tokenizes like the tokenizer the file was written from
    tok = Tokenizer.from_file(d / "tokenizer.json")
    text = "class Point:\n    def __init__(self, x, y):  # naïve 日本語 " + ggufs[arch].specials[1]
    assert tok.encode(text) == ggufs[arch].tokenizer.encode(text, add_special_tokens=False).ids
    assert tok.decode(tok.encode(text)) == text
    assert set(tok.special_tokens) == set(ggufs[arch].specials)
    saved = json.loads((d / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None  # long documents are not cut
    report = read_report(d)
    assert report["source"].endswith((".gguf", arch))
    diffs = report["verify"]["max_abs_diff"]
    assert diffs and all(0 <= v < 1e-4 for v in diffs.values()), diffs


def test_specls_complete_on_gguf_export(
    exported_gguf: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "example.py"
    f.write_text(SOURCE)
    for arch, d in exported_gguf.items():
        argv = ["complete", str(f), "--line", "1", "--character", "10", "--model", str(d), "--draft", str(d)]
        assert main([*argv, "--json", "--threads", "1", "--max-tokens", "16"]) == 0
        out = capsys.readouterr()
        result = json.loads(out.out)
        assert result["tokens"] > 0 and result["text"], (arch, result, out.err)
        assert main([*argv, "--threads", "1", "--max-tokens", "16", "--no-speculation"]) == 0
        plain = capsys.readouterr().out
        assert plain == result["text"] + ("" if result["text"].endswith("\n") else "\n")


def _margin(engine: OnnxEngine, prompt: list[int], ref: list[int], got: list[int]) -> str:
    j = first_difference(ref, got)
    return (
        f"diverged at token {j}: {describe_margin(plain_greedy_margin(engine.models.target, prompt, ref, j))}"
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_speculative_equals_plain_greedy_on_gguf_export(exported_gguf: dict[str, Path], arch: str) -> None:
    d = str(exported_gguf[arch])
    # the model drafts for itself: the draft-model path runs on the same graph as the target
    base = OnnxEngine(EngineSettings(model=d, draft=d, threads=1, lru_size=0))
    base.load()
    plain = base.with_settings(EngineSettings(model=d, speculation=False, lru_size=0))
    fim = base.models.fim
    if arch == "llama":
        assert fim is None
    else:
        assert fim is not None and fim.order == "psm" and fim.file_sep_id is None
    drafted = 0
    for config in (EngineSettings(draft_model=False), EngineSettings(lookup=False), EngineSettings()):
        spec = base.with_settings(replace(config, model=d, draft=d, lru_size=0))
        for i, (a, b) in enumerate(CUTS):
            doc = f"file:///w/{arch}{i}.py"
            for e in (plain, spec):
                e.update_document(doc, SOURCE)
            request = CompletionRequest(doc_id=doc, prefix=SOURCE[:a], suffix=SOURCE[b:], max_tokens=24)
            plain.complete(request)
            r = spec.complete(request)
            assert spec.last_prompt == plain.last_prompt
            assert spec.last_tokens == plain.last_tokens, _margin(
                base, plain.last_prompt, plain.last_tokens, spec.last_tokens
            )
            drafted += r.drafted
            if fim is None:  # prefix-only: the prompt is the prefix's tokens, no FIM token anywhere
                assert plain.last_prompt == base.models.tokenizer.encode(SOURCE[:a])
    assert drafted > 0


def test_fim_family_none_forces_prefix_only(ggufs: dict[str, TinyGguf], tmp_path: Path) -> None:
    """``--fim-family none`` on a FIM vocabulary: specls.json says no template, the engine's prompt
    holds no FIM token (one name from the CLI through specls.json to the engine)."""
    out = tmp_path / "none"
    rc = main(
        [
            "export",
            str(ggufs["qwen2"].path),
            "--out",
            str(out),
            "--fim-family",
            "none",
            "--ort-fusions",
            "none",
        ]
    )
    assert rc == 0
    assert json.loads((out / "specls.json").read_text())["fim"] is None
    engine = OnnxEngine(EngineSettings(model=str(out), draft_model=False, threads=1))
    engine.load()
    assert engine.models.fim is None
    tok = engine.models.tokenizer
    engine.complete(
        CompletionRequest(doc_id="file:///x.py", prefix=SOURCE[:30], suffix=SOURCE[30:], max_tokens=4)
    )
    fim_ids = {tok.token_to_id(t) for t in QWEN_PARTIAL_FIM[1:]}
    assert engine.last_prompt == tok.encode(SOURCE[:30])
    assert not fim_ids & set(engine.last_prompt)  # Not the detected qwen2.5-coder layout


def test_gguf_source_errors(ggufs: dict[str, TinyGguf], tmp_path: Path) -> None:
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(ggufs["llama"].path.read_bytes())
    with pytest.raises(ExportError, match=r"2 GGUF files \(a\.gguf, b\.gguf\)"):
        export_model(str(two), tmp_path / "o", ExportOptions())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really" * 10)
    with pytest.raises(ExportError, match="not a readable GGUF file"):
        export_model(str(bad), tmp_path / "o", ExportOptions())
    with pytest.raises(ExportError, match="no such GGUF file"):
        export_model(str(tmp_path / "missing.gguf"), tmp_path / "o", ExportOptions())
    with pytest.raises(ExportError, match="share_weights"):
        export_model(str(ggufs["llama"].path), tmp_path / "o", ExportOptions(share_weights=True))
    assert not (tmp_path / "o" / "specls.json").exists()
