"""Write the workspaces of ``bench real``'s novel tasks as folders: per package, the files its
workspace index reads (the package without the files that hold tasks), at their paths in it. A
corpus for ``specls head train --from OUT/<package>`` that holds no task's code.

    .venv/bin/python bench/scripts/novel_workspaces.py NOVEL_SDISTS OUT [--n 14] [--seed 0]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("novel_sdists", help="bench real's --novel-sdists folder")
    p.add_argument("out", help="a folder to write one folder per package into")
    p.add_argument("--n", type=int, default=14)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from specls.bench.novel_tasks import novel_tasks, workspace_of
    from specls.workspace_index import workspace_files

    tasks = novel_tasks(
        Path(args.novel_sdists), Path(tempfile.mkdtemp(prefix="specls-ws-")), args.n, args.seed
    )
    for pkg, held in workspace_of(tasks).items():
        files = workspace_files(pkg, exclude=held)
        dest = Path(args.out) / pkg.name
        for f in files:
            target = dest / f.relative_to(pkg)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
        print(f"{dest}: {len(files)} files ({len(held)} held out: {', '.join(h.name for h in held)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
