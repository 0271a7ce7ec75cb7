"""Convert a specls HF checkpoint (byte-level BPE, GPT-2 pre-tokenizer, no sentencepiece model) to GGUF
with the ``convert_hf_to_gguf.py`` shipped in llama-cpp-python's sdist (``vendor/llama.cpp``).

The stock converter fails on our checkpoints in two places, patched here without editing it:
- Llama's ``set_vocab`` tries sentencepiece first (ImportError without it, and we have no
  tokenizer.model): go straight to the GPT-2 BPE path;
- the pre-tokenizer is identified by hashing a probe string's tokens; ours is unknown to the table,
  so ``get_vocab_base_pre`` raises. Our tokenizer is ByteLevel with the GPT-2 regex: say "gpt-2".

Usage: python convert_gguf.py LLAMA_CPP_DIR HF_DIR OUT.gguf  (HF_DIR: e.g. models/bundled/target, which is
also the HF checkpoint: config.json + model.safetensors beside the ONNX graphs)
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    llama_dir, hf_dir, out = Path(argv[0]), argv[1], argv[2]
    sys.path.insert(0, str(llama_dir))
    sys.path.insert(1, str(llama_dir / "gguf-py"))
    import conversion  # type: ignore[import-not-found]
    import conversion.base as base  # type: ignore[import-not-found]
    import conversion.llama as llama  # type: ignore[import-not-found]

    def set_vocab(self: object) -> None:
        self._set_vocab_gpt2()  # type: ignore[attr-defined]

    def pre(self: object, tokenizer: object) -> str:
        return "gpt-2"

    llama.LlamaModel.set_vocab = set_vocab
    base.TextModel.get_vocab_base_pre = pre
    del conversion
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", "f32"]
    import runpy

    runpy.run_path(str(llama_dir / "convert_hf_to_gguf.py"), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
