"""Manual check (not part of the pytest run): specls's RemoteEngine against llama-cpp-python's
OpenAI-compatible server (``python -m llama_cpp.server``) serving the bundled target converted to GGUF
(``convert_gguf.py``). Compares its greedy completions with plain greedy decoding of the bundled ONNX
target on the same FIM prompt, and checks cancellation aborts the stream.

Usage: python tests/team/llama/check_llama_server.py LLAMA_VENV_PYTHON MODEL.gguf
Exit 0 when every check passed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from specls.models.loader import bundled_dir, load_model
from specls.models.runtime import RuntimeSettings

from specls.api import CompletionRequest
from specls.team.remote import RemoteEngine, RemoteSettings

FIM = "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"
CASES = [
    (
        "import os\nimport sys\n\n\ndef main(argv):\n    ",
        "\n\nif __name__ == '__main__':\n    main(sys.argv)\n",
    ),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.", "\n"),
    ("def add(a, b):\n    return ", "\n"),
]
MAX = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def onnx_greedy(prefix: str, suffix: str) -> str:
    lm = load_model(bundled_dir("target"), RuntimeSettings(threads=1, provider="cpu"))
    tok = lm.tokenizer
    ids = tok.encode(FIM.replace("{prefix}", prefix).replace("{suffix}", suffix))
    cache = lm.new_cache()
    logits = cache.forward(ids)
    out: list[int] = []
    for _ in range(MAX):
        nxt = int(logits[-1].argmax())
        if nxt in lm.eos_token_ids:
            break
        out.append(nxt)
        logits = cache.forward([nxt])
    return str(tok.decode(out))


def main(argv: list[str]) -> int:
    py, gguf = argv[0], argv[1]
    port = free_port()
    proc = subprocess.Popen(
        [
            py,
            "-m",
            "llama_cpp.server",
            "--model",
            gguf,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "1024",
            "--n_threads",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # llama.cpp logs a lot: a pipe nobody reads would block it
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    ok = True
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        else:
            print("llama_cpp.server did not come up", file=sys.stderr)
            return 1
        remote = RemoteEngine(
            RemoteSettings(base_url=url, fim_template=FIM, stop=("<|endoftext|>",), cache_size=0)
        )
        remote.load()
        print(f"llama_cpp.server up, model {remote.stats()['model']!r}")
        for prefix, suffix in CASES:
            got = remote.complete(CompletionRequest("d", prefix, suffix, max_tokens=MAX))
            want = onnx_greedy(prefix, suffix)
            same = got.text == want
            ok &= same
            print(f"{'SAME' if same else 'DIFF'} llama.cpp={got.text!r} onnx={want!r} ({got.tokens} chunks)")
        flag = threading.Event()
        threading.Timer(0.3, flag.set).start()
        t0 = time.monotonic()
        r = remote.complete(CompletionRequest("d2", "x = [", "]", max_tokens=900), flag.is_set)
        print(
            f"cancel: cancelled={r.cancelled} after {time.monotonic() - t0:.2f}s "
            f"aborted_streams={remote.stats()['aborted_streams']}"
        )
        ok &= r.cancelled
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
