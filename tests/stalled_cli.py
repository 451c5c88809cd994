"""The ggtools CLI with one function stalled, so that a test can send a signal at a known point of a run:

    python -m tests.stalled_cli MODULE:NAME MARKER ggtools-args...

The first call of MODULE.NAME (NAME may be Class.method) creates the file MARKER, then sleeps (the test sends
its signal meanwhile) before going on; everything else runs as `python -m ggtools` would. `stop_while_stalled`
runs it and sends the signal.
"""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

STALL = 120     # seconds: far longer than any test waits
ROOT = Path(__file__).resolve().parents[1]


def stop_while_stalled(args, stalled, sig, tmp_path, look=None):
    """Run `ggtools args` with `stalled` stalled and a private $TMPDIR, send sig once it is stalled; returns
    (the finished process, its stderr, the $TMPDIR, what the directories `look` and $TMPDIR held when the signal
    was sent)."""
    tmp, marker = Path(tmp_path) / "tmp", Path(tmp_path) / "stalled"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-m", "tests.stalled_cli", stalled, str(marker), *args], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert p.poll() is None and time.monotonic() < deadline, (stalled, p.communicate())
        time.sleep(0.02)
    seen = sorted(os.listdir(look) if look else []) + sorted(os.listdir(tmp))
    os.kill(p.pid, sig)
    _, stderr = p.communicate(timeout=120)
    return p, stderr, tmp, seen


def stall(target: str, marker: str) -> None:
    module, _, name = target.partition(":")
    owner_name, _, attr = name.rpartition(".")
    owner = importlib.import_module(module)
    if owner_name:
        owner = getattr(owner, owner_name)
    original = getattr(owner, attr)
    calls = []

    def stalled(*args, **kwargs):
        if not calls:
            calls.append(1)
            with open(marker, "w"):
                pass
            time.sleep(STALL)
        return original(*args, **kwargs)

    setattr(owner, attr, stalled)


if __name__ == "__main__":
    stall(sys.argv[1], os.path.abspath(sys.argv[2]))
    from ggtools.cli import main
    main(sys.argv[3:], prog_name="ggtools")
