"""Each bench's section of docs/benchmarks.md: the command that made it, the machine line, its tables.

  python -m scripts.bench.<name> ... --markdown                     prints the section
  python -m scripts.bench.<name> ... --markdown docs/benchmarks.md  writes it between the page's markers
                                                                     <!-- bench:<name> --> and <!-- /bench:<name> -->
"""

import datetime
import os
import shlex
import subprocess
import sys
from pathlib import Path

from scripts.bench.native_llama import simd_flags

ROOT = Path(__file__).resolve().parents[2]


def add_option(parser) -> None:
    parser.add_argument("--markdown", nargs="?", const="-", metavar="PAGE",
                        help="print the result as this bench's section of docs/benchmarks.md; given PAGE, write it "
                             "there between the bench's markers instead")


def prints_markdown(args) -> bool:
    """True when the section replaces the text report on stdout (--markdown without a page)."""
    return args.markdown == "-"


def _cpuinfo() -> dict:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    info = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def cpu_model() -> str:
    info = _cpuinfo()
    name = info.get("model name") or info.get("Hardware") or os.uname().machine
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return name


def memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def commit() -> str:
    """`git rev-parse --short HEAD`, saying so when the tracked files differ from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_line() -> str:
    return (f"Machine: {cpu_model()}, {os.cpu_count()} CPUs, {memory_gib():.0f} GiB; {simd_flags() or 'no SIMD flags'}. "
            f"{datetime.date.today().isoformat()}, commit {commit()}.")


def command() -> str:
    """The bench's command line as run from the repository root, --markdown left out."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
            if not arg.startswith("-"):
                continue
        if arg == "--markdown":
            skip = True
            continue
        if not arg.startswith("--markdown="):
            args.append(arg)
    return shlex.join(["python", "-m", f"scripts.bench.{Path(sys.argv[0]).stem}", *args])


def table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def section(body: str) -> str:
    return f"`{command()}`\n\n{machine_line()}\n\n{body.strip()}\n"


def markers(name: str) -> tuple:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def replace_section(page: Path, name: str, text: str) -> None:
    """The page with the text between the bench's markers replaced, written atomically."""
    begin, end = markers(name)
    doc = page.read_text()
    start, stop = doc.find(begin), doc.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{page}: no section for the bench {name!r} (the markers {begin} ... {end})")
    tmp = page.with_name(f".{page.name}.partial-{os.getpid()}")
    tmp.write_text(doc[:start + len(begin)] + "\n" + text + doc[stop:])
    os.replace(tmp, page)


def emit(args, name: str, body: str) -> None:
    """The bench's section printed, or written into the page --markdown named."""
    text = section(body)
    if prints_markdown(args):
        print(text, end="")
    else:
        replace_section(Path(args.markdown), name, text)
        print(f"wrote the {name} section of {args.markdown}", file=sys.stderr)


def publish(args, name: str, body: str) -> None:
    """The section where --markdown asks for it, and the body as the text report unless the section took stdout."""
    if args.markdown:
        emit(args, name, body)
    if not prints_markdown(args):
        print(body)
