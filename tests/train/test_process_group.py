"""Issue 54 item 9: a single trainer rank joined a private process group through a file store at
`tempfile.mktemp("top_rl_pg_")`: a file in /tmp, outside run_dir, that no one removed when the rank was killed (as
Ray kills its actors at the end of a run): 108 of them after an afternoon. The private group is in memory now."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_single_rank_group_leaves_no_file_behind_even_when_killed(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = ("import os, torch, torch.distributed as dist\n"
            "from top_rl.train.parallel import init_process_group\n"
            "init_process_group()\n"
            "t = torch.ones(2)\n"
            "dist.all_reduce(t)\n"
            "assert dist.get_world_size() == 1 and t.tolist() == [1.0, 1.0]\n"
            "print('joined', flush=True)\n"
            "os._exit(0)  # as a killed actor ends: no destructor, no destroy_process_group\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)})
    assert out.returncode == 0 and "joined" in out.stdout, out.stderr[-3000:]
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("top_rl_pg_")) == []
