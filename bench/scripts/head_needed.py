"""How sure must a cheap draft be to take the novel tasks to 2x? Decodes ``bench real``'s novel tasks
plain greedy once, then replays each output pass by pass: lookup's candidate (as ``candidate_oracle``'s
``single``: the prompt and output, then the workspace, then the datastore), its length picked by the
drafting policy's rule (``best_gamma``) from acceptance by position learned over the same replay per
kind of match, each pass priced by a verify-cost table (run 46's learned one unless given). Then the
same replay with a synthetic head beside it: its guess costs ``--cost`` of a pass, is right at its
first position with probability ``a`` and at later ones ``0.85 a``, independently of lookup (which
flatters it: the real head misses where lookup misses), and is drafted whenever the rule prices it
above lookup's candidate. Prints tokens a pass and the estimated speedup over plain per ``a``.

    .venv/bin/python bench/scripts/head_needed.py MODEL_DIR NOVEL_SDISTS [--datastore site-packages]

Estimates from a cost model, not timings: the ratios between rows are what it is for. Run it alone.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

from candidate_oracle import agreed, decode_novel_tasks
from specls.decoder.policy import PassCosts, best_gamma

RUN46_VERIFY = (1.0, 1.0, 1.034, 1.034, 1.093, 1.093, 1.142, 1.142, 1.172)  # lookup arm, learned
K = 8  # tokens a candidate holds


def lookup_candidate(seq: Sequence[int], p: int, stores: Sequence[Any]) -> tuple[list[int], str]:
    """(lookup's candidate for ``seq[p:]``, its kind: where it came from and how long a tail matched).

    >>> lookup_candidate([5, 1, 2, 5, 1], 5, [])
    ([2, 5, 1], 'buffer 2')
    >>> lookup_candidate([5, 1, 2, 3], 4, [])   # Not ([5, 1, 2], ...): 3 never came before
    ([], 'none')
    """
    for n in range(min(4, p - 1), 0, -1):
        tail = list(seq[p - n : p])
        j = next((j for j in range(p - 1, n - 1, -1) if list(seq[j - n : j]) == tail), None)
        if j is not None:  # the most recent occurrence, as ``candidate_oracle``'s single candidate
            return list(seq[j : min(j + K, p)]), f"buffer {n}"
    for s in stores:
        m = s.match(seq[:p], K)
        if m is not None and m.tokens:
            return list(m.tokens), f"{s.name} {min(m.n, 4)}"
    return [], "none"


def acceptance(decoded: Sequence[tuple[list[int], int, list[Any]]]) -> dict[str, list[float]]:
    """Per kind of match: acceptance by position over every output position (accepted at i / reached i,
    a prior of 0.5 worth two observations)."""
    seen: dict[str, list[list[int]]] = {}
    for seq, start, stores in decoded:
        for p in range(start, len(seq)):
            c, kind = lookup_candidate(seq, p, stores)
            if not c:
                continue
            a = agreed([c], seq[p:], K)
            cells = seen.setdefault(kind, [[0, 0] for _ in range(K)])
            for i in range(min(len(c), a + 1)):
                cells[i][0] += 1
                cells[i][1] += int(i < a)
    return {kind: [(hit + 1.0) / (n + 2.0) for n, hit in cells] for kind, cells in seen.items()}


def replay(
    decoded: Sequence[tuple[list[int], int, list[Any]]],
    rates: dict[str, list[float]],
    costs: PassCosts,
    head: tuple[float, float] | None,
    seed: int = 0,
) -> tuple[float, float]:
    """(tokens a pass, estimated speedup over plain) of lookup, with ``head`` = (a, cost) beside it."""
    rng = random.Random(seed)
    tokens = passes = 0
    cost = 0.0
    for seq, start, stores in decoded:
        p = start
        while p < len(seq):
            c, kind = lookup_candidate(seq, p, stores)
            g, s = best_gamma(rates.get(kind, [0.0]), costs, 0.0, len(c)) if c else (0, 1.0)
            a, price = agreed([c], seq[p:], g), costs.verify_cost(g)
            if head is not None:
                first, guess = head
                accept = [first] + [0.85 * first] * 3
                gh, sh = best_gamma(accept, costs, 0.0, 4, fixed=guess)
                if gh > 0 and sh > s:
                    a = 0
                    while a < gh and rng.random() < accept[a]:
                        a += 1
                    price = costs.verify_cost(gh) + guess
            n = min(a + 1, len(seq) - p)
            tokens, passes, cost, p = tokens + n, passes + 1, cost + price, p + n
    return tokens / passes, tokens / cost


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="the target's specls model directory")
    p.add_argument("novel_sdists", help="bench real's --novel-sdists folder")
    p.add_argument("--datastore", default="site-packages")
    p.add_argument("--cost", type=float, default=0.086, help="a guess, in one-token passes (run 46)")
    p.add_argument("--accept", default="0.3,0.4,0.5,0.6,0.7,0.8", help="first-position acceptances")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n", type=int, default=14)
    args = p.parse_args()
    decoded, _ = decode_novel_tasks(args.model, args.novel_sdists, args.datastore, args.threads, args.n)
    costs = PassCosts(verify=RUN46_VERIFY)
    rates = acceptance(decoded)
    tpp, speedup = replay(decoded, rates, costs, None)
    print(f"{len(decoded)} novel tasks; verify costs {RUN46_VERIFY}; a guess {args.cost} of a pass")
    print(f"lookup alone: {tpp:.3f} tokens a pass, estimated {speedup:.3f}x plain")
    for a in (float(x) for x in args.accept.split(",")):
        tpp_h, s_h = replay(decoded, rates, costs, (a, args.cost))
        print(
            f"+ head right {a:.2f} at its first guess: {tpp_h:.3f} tokens a pass, estimated {s_h:.3f}x ({s_h / speedup:.3f} of lookup alone)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
