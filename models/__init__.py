"""specls.models: loading, ONNX export, ORT sessions and KV caches, tokenizers/FIM templates, the bundled pair."""
