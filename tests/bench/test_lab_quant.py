"""bench/lab/quant.py (`python -m bench.lab.quant`): the variant grid, the table, the accuracy_level rewrite (equal to quantizing
at that level), and one small sweep end to end on a tiny exported Qwen2 checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.lab.quant import (
    QuantBenchOptions,
    Row,
    Variant,
    common_prefix,
    format_row,
    format_table,
    run_bench,
    set_accuracy_level,
    variant_grid,
)


@pytest.mark.parametrize(
    ("blocks", "levels", "embedding", "at", "want", "int8"),
    [
        # the level-sharing neighbours stay together; the embedding variant comes last
        (
            (32, 64),
            (4, 0),
            True,
            (32, 4),
            ["fp32", "b32-l4", "b32-l0", "b64-l4", "b64-l0", "b32-l4-keep-emb"],
            False,
        ),
        # no embedding variant: wrong would be a stray keep-emb row
        ((128,), (0,), True, None, ["fp32", "b128-l0"], False),
        # a repeated block is measured once (wrong: two b32-l4 rows)
        ((32, 32), (4,), True, None, ["fp32", "b32-l4"], False),
        # default embedding kept: the extra variant quantizes it (wrong: a second kept row)
        ((32,), (4,), False, (32, 4), ["fp32", "b32-l4-keep-emb", "b32-l4"], False),
        # int8 last, with the default embedding (wrong: "fp32" for a variant without a block size)
        ((64,), (4,), True, None, ["fp32", "b64-l4", "int8"], True),
    ],
)
def test_variant_grid(
    blocks: tuple[int, ...], levels: tuple[int, ...], embedding: bool, at: Any, want: list[str], int8: bool
) -> None:
    assert [v.name for v in variant_grid(blocks, levels, embedding, at, int8)] == want


def test_weights_key_groups_levels_only() -> None:
    assert Variant(32, 0).weights_key == Variant(32, 4).weights_key
    assert Variant(32, 4).weights_key != Variant(64, 4).weights_key
    assert Variant(32, 4).weights_key != Variant(32, 4, embedding=False).weights_key
    assert Variant().weights_key != Variant(kernel="integer").weights_key  # int8 is not fp32's graph


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([5], [6]) == 0  # wrong: counting matches after a divergence
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_table_rows() -> None:
    fp32 = Row("fp32", size_bytes=7_120_000_000, load_s=23.4, prefill_tok_s=19.0, decode_tok_s=0.78)
    fp32.keystroke_ms, fp32.keystroke_tok_s, fp32.decoded = 800.0, 20.0, [1, 2]
    q = Row("b32-l4", size_bytes=1_240_000_000, quantize_s=181.2, quantize_peak_rss=3 * 2**30, load_s=8.2)
    q.prefill_tok_s, q.keystroke_ms, q.keystroke_tok_s, q.decode_tok_s = 16.1, 310.0, 51.6, 2.63
    q.decoded, q.greedy_same, q.top1, q.fim_top1, q.mean_kl, q.agreement_positions = (
        [1, 3],
        1,
        0.915,
        0.904,
        0.05,
        512,
    )
    shared = Row("b32-l0", size_bytes=1_240_000_000, shared_with="b32-l4", decoded=[1, 2], greedy_same=2)
    table = format_table([fp32, q, shared], QuantBenchOptions(fp32=Path("x"), threads=2)).splitlines()
    assert table[0].startswith("2 threads; agreement over 512 held-out positions")
    assert "prefill 256" in table[1] and "+16 on cached 256" in table[1] and "decode 32" in table[1]
    assert table[3] == "| fp32 | 7.12 GB |  | 23.4 s | 19.0 tok/s | 800 ms (20 tok/s) | 0.78 tok/s |  |  |  |"
    assert table[4] == (
        "| b32-l4 | 1.24 GB | 181 s (3.0 GiB) | 8.2 s | 16.1 tok/s | 310 ms (52 tok/s) | 2.63 tok/s | 1/2 | "
        "91.5% (90.4%) | 0.0500 |"
    )
    assert "= b32-l4's" in table[5] and "2/2" in table[5]  # the shared graph: no quantize time of its own
    q.extra_decode_tok_s = 1.5
    assert "2.63 tok/s (1.50)" in format_row(q, extra=True)


@pytest.fixture(scope="module")
def tiny_fp32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specls.models.export import ExportOptions, export_model

    from tests.models.conftest import build_checkpoint

    root = tmp_path_factory.mktemp("quant-bench")
    ckpt = build_checkpoint(root / "ckpt", "qwen2")
    return export_model(str(ckpt), root / "fp32", ExportOptions(tolerance=1e-4, quantize="none"))


def _nodes(path: Path) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
    import onnx

    model = onnx.load(str(path))
    return [
        (n.op_type, tuple(n.input), {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
        for n in model.graph.node
    ]


@pytest.mark.slow
def test_set_accuracy_level_equals_quantizing_at_that_level(tiny_fp32: Path, tmp_path: Path) -> None:
    import onnx
    from specls.models.quantize import QuantizeOptions, quantize_graph

    src = tiny_fp32 / "model.onnx"
    quantize_graph(src, tmp_path / "l0.onnx", QuantizeOptions(accuracy_level=0))
    quantize_graph(src, tmp_path / "l4.onnx", QuantizeOptions(accuracy_level=4))
    assert _nodes(tmp_path / "l0.onnx") != _nodes(tmp_path / "l4.onnx")  # the attribute is there to rewrite
    assert set_accuracy_level(tmp_path / "l4.onnx", 0) >= 9
    assert _nodes(tmp_path / "l4.onnx") == _nodes(tmp_path / "l0.onnx")
    a, b = (onnx.load(str(tmp_path / f)).graph.initializer for f in ("l0.onnx", "l4.onnx"))
    assert {t.name: t.raw_data for t in a} == {t.name: t.raw_data for t in b}  # same packed blocks


@pytest.mark.slow
def test_sweep_end_to_end_on_a_tiny_model(tiny_fp32: Path, tmp_path: Path) -> None:
    opt = QuantBenchOptions(
        fp32=tiny_fp32,
        blocks=(32,),
        levels=(4, 0),
        embedding_at=(32, 4),  # not the default block: the extra variant sits where it is asked for
        threads=1,
        prompt_tokens=24,
        keystroke_tokens=4,
        decode_tokens=4,
        positions=64,
        window=32,
        scratch=tmp_path,
        json_out=tmp_path / "out.json",
    )
    rows = run_bench(opt)
    assert [r.variant for r in rows] == ["fp32", "b32-l4", "b32-l0", "b32-l4-keep-emb", "int8"]
    fp32, l4, l0, keep, int8 = rows
    assert l4.quantize_s is not None and l4.quantize_peak_rss and l4.quantize_peak_rss > 0
    assert l0.shared_with == "b32-l4" and l0.quantize_s is None
    assert keep.size_bytes > l4.size_bytes  # the fp32 embedding table is bigger than its int4 blocks
    assert int8.shared_with is None and int8.quantize_s is not None  # its own graph, not b32's
    assert l4.size_bytes < int8.size_bytes < fp32.size_bytes  # 8-bit weights: between int4 and fp32
    for r in rows[1:]:
        assert r.top1 is not None and 0.0 <= r.top1 <= 1.0 and r.mean_kl is not None and r.mean_kl >= 0
        assert r.agreement_positions == 64 and len(r.decoded) == 4
        assert r.prefill_tok_s > 0 and r.decode_tok_s > 0
    assert list(tmp_path.glob("specls-quant-*")) == []  # the variant dirs are gone
    assert '"b32-l4-keep-emb"' in (tmp_path / "out.json").read_text()
