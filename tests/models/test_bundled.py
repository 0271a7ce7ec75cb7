"""The bundled target/draft pair ships inside the package: it loads from an installed, non-editable wheel
(graphs reading their weights from the shipped model.safetensors), gives finite logits of the right
shape, and the draft is at least 8x smaller than the target."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "models" / "bundled"

pytestmark = pytest.mark.slow

_needs_pair = pytest.mark.skipif(
    not (BUNDLED / "target" / "model.onnx").is_file() or not (BUNDLED / "draft" / "model.onnx").is_file(),
    reason="bundled pair not built (python -m specls.models.train)",
)

_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import specls, specls.models.loader as loader
    from specls.models.runtime import RuntimeSettings
    out = {"specls": specls.__file__, "loader": loader.__file__, "models": {}}
    settings = RuntimeSettings(threads=1, provider="cpu")
    target, draft = loader.load_pair(None, None, settings)
    for role, lm in (("target", target), ("draft", draft)):
        ids = lm.tokenizer.encode("def add(a, b):\\n    return a + b\\n")
        cache = lm.new_cache()
        logits = np.asarray(cache.forward(ids))
        more = np.asarray(cache.forward(ids[:2]))
        out["models"][role] = {
            "dir": str(lm.model_dir),
            "n": len(ids),
            "shape": list(logits.shape),
            "shape2": list(more.shape),
            "vocab": lm.vocab_size,
            "finite": bool(np.isfinite(logits).all() and np.isfinite(more).all()),
            "cache_len": cache.length,
            "batch_onnx_file": lm.spec.batch_onnx_file,
        }
    print(json.dumps(out))
    """
)


@_needs_pair
def test_bundled_pair_loads_from_installed_wheel(tmp_path: Path) -> None:
    # Build from a copy of the package sources (not the live tree, which others edit concurrently).
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("specls", "lsp", "decoder", "models"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    dist, site = tmp_path / "dist", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w", str(dist)], check=True
    )
    wheels = list(dist.glob("specls-*.whl"))
    assert len(wheels) == 1
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheels[0])], check=True)
    installed = site / "specls" / "models" / "bundled"
    for role, names in (
        ("target", ("model.onnx", "model.batch.onnx", "model.safetensors", "config.json", "specls.json")),
        ("draft", ("model.onnx", "model.safetensors", "config.json", "specls.json")),
    ):
        for name in names:
            assert (installed / role / name).is_file(), (role, name)
        # one copy of the weights: the graph holds none of them
        st_bytes = (installed / role / "model.safetensors").stat().st_size
        assert (installed / role / "model.onnx").stat().st_size < st_bytes / 5
    assert not (site / "specls" / "models" / "checkpoints").exists()

    # -S: no site processing, so the editable install's finder cannot shadow the wheel; dependencies
    # come from the venv's site-packages after the wheel's directory.
    env = {"PYTHONPATH": f"{site}:{sysconfig.get_paths()['purelib']}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-S", "-c", _PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key in ("specls", "loader"):
        assert Path(out[key]).resolve().is_relative_to(site.resolve()), out[key]
        assert not Path(out[key]).resolve().is_relative_to(REPO)
    for role in ("target", "draft"):
        m = out["models"][role]
        assert Path(m["dir"]).resolve().is_relative_to(site.resolve())
        assert m["n"] > 3
        assert m["shape"] == [m["n"], m["vocab"]]
        assert m["shape2"] == [2, m["vocab"]]
        assert m["vocab"] >= 8192
        assert m["finite"]
        assert m["cache_len"] == m["n"] + 2
    assert out["models"]["target"]["batch_onnx_file"] == "model.batch.onnx"
    assert out["models"]["draft"]["batch_onnx_file"] is None


@pytest.mark.skipif(not (BUNDLED / "target" / "config.json").is_file(), reason="no HF config in the bundle")
def test_draft_is_8x_smaller_than_target() -> None:
    from specls.models.train import params_from_config

    target = json.loads((BUNDLED / "target" / "config.json").read_text())
    draft = json.loads((BUNDLED / "draft" / "config.json").read_text())
    pt, pd = params_from_config(target), params_from_config(draft)
    assert 10_000_000 <= pt <= 20_000_000
    assert pd * 8 <= pt
    assert draft["vocab_size"] == target["vocab_size"]
    assert draft["num_hidden_layers"] <= 2


@_needs_pair
def test_bundled_tokenizers_match_and_have_the_special_tokens() -> None:
    vocabs = []
    for role in ("target", "draft"):
        ck = json.loads((BUNDLED / role / "tokenizer.json").read_text())
        vocabs.append(ck["model"]["vocab"])
        # the HF side of the bundle (tokenizer_config.json) names the same special tokens
        hf = json.loads((BUNDLED / role / "tokenizer_config.json").read_text())
        assert hf.get("eos_token") == "<|endoftext|>"
        names = {t["content"]: t["id"] for t in ck["added_tokens"]}
        for i, tok in enumerate(
            ("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<file_sep>", "<pad>")
        ):
            assert names[tok] == i
    assert vocabs[0] == vocabs[1]


@_needs_pair
def test_bundled_target_logits_do_not_depend_on_how_the_tokens_are_split_into_passes() -> None:
    from specls.models.loader import bundled_dir, load_model
    from specls.models.runtime import RuntimeSettings

    from tests.models.split_check import assert_split_invariant

    lm = load_model(bundled_dir("target"), RuntimeSettings(threads=1, provider="cpu"))
    ids = lm.tokenizer.encode(
        "import os\n\ndef walk(root):\n    for name in os.listdir(root):\n        yield name\n"
    )
    assert len(ids) >= 23
    assert_split_invariant(lm, ids[:11], ids[11:23])
