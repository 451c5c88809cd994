"""Outputs: where a command may write, and how.

Every output path goes through `check_output` before anything is written: it must not be one of the
command's inputs (compared after resolving symbolic links, and by inode for hard links), must not be a
directory or a special file, its directory must exist, and an existing file is replaced only with --force.
`AtomicOutput` then writes under a temporary name beside the target (`.NAME.partial-PID`), fsyncs and
renames; on any error or interrupt the temporary file is removed, and before a new write the temporary files
that killed runs left for the same target are removed. OS errors (permissions, read-only or full file
systems, file size limits) become one GGUFError naming the path and the reason.

Without --force the final step never replaces a file: it links the temporary file to its name (which fails
when a file appeared there meanwhile, atomically) and removes the temporary name; of several writers of one
output only the first to finish wins, the others fail saying the output appeared.

Every temporary file and directory this process makes is registered (`pending`) before it exists, so a stop
signal arriving at any moment leaves nothing behind: the CLI removes whatever is still registered
(`remove_pending`) on the way out.
"""

import contextlib
import errno
import glob
import os
import shutil
import stat
import tempfile

from ggtools.gguf.errors import GGUFError
from ggtools.gguf.inputs import kind

TEMP_MARK = ".partial-"
COPY_CHUNK = 64 << 20


def same_file(a, b) -> bool:
    """Whether two paths name one file: the same path once links are resolved, or the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, inputs=(), *, force=False, hint="") -> str:
    """Refuse an output that is an input, a directory or special file, in a missing directory, or that
    exists (without force). hint: what to say after 'an output never replaces an input'."""
    path = os.fspath(path)
    for p in inputs:
        if same_file(path, p):
            shown = "" if os.path.abspath(p) == os.path.abspath(path) else f" ({p})"
            raise GGUFError(path, f"is an input of this command{shown}: an output never replaces an input{hint}")
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise GGUFError(path, f"is {kind(st)}: name an output file" if stat.S_ISDIR(st.st_mode) else
                        f"is {kind(st)}, not a regular file: refusing to replace it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise GGUFError(path, f"cannot write: the directory {parent} does not exist")
    if os.path.lexists(path) and not force:
        raise GGUFError(path, "output exists; pass --force to overwrite it")
    return path


def os_error(path, e: OSError) -> GGUFError:
    """One line for an OS error met while writing path."""
    reason = e.strerror or str(e)
    if e.errno == errno.EFBIG:
        reason += " (the file size limit was reached)"
    return GGUFError(path, f"cannot write: {reason}")


_pending: set[str] = set()      # temporary files and directories of this process, not yet committed or removed


def remove_pending():
    """Remove every temporary file and directory still registered (after an interrupt)."""
    for p in sorted(_pending, reverse=True):
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        _pending.discard(p)


@contextlib.contextmanager
def temporary_directory(prefix: str):
    """A new directory under $TMPDIR, removed with everything in it on leaving, also on errors, ^C and stop
    signals (registered before it exists)."""
    parent = tempfile.gettempdir()
    name = os.path.join(parent, f"{prefix}{os.getpid()}-{os.urandom(4).hex()}")
    _pending.add(name)
    try:
        try:
            os.mkdir(name, 0o700)
        except OSError as e:
            raise os_error(name, e) from None
        yield name
    finally:
        shutil.rmtree(name, ignore_errors=True)
        _pending.discard(name)


def make_dir(path):
    """os.makedirs(path, exist_ok=True), with one-line errors."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise GGUFError(path, "exists and is not a directory") from None
    except OSError as e:
        raise os_error(e.filename or path, e) from None


def temp_path(path) -> str:
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}{TEMP_MARK}{os.getpid()}")


def remove_stale_temps(path):
    """Remove the temporary files of `path` left by processes that no longer run (killed runs)."""
    directory, base = os.path.split(os.path.abspath(path))
    for p in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}{TEMP_MARK}*")):
        pid = p.rpartition(TEMP_MARK)[2]
        if pid.isdigit() and not _running(int(pid)):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed process still answers kill(pid, 0) until its parent reaps it; after a SIGKILL of the whole run
    nobody may (a container's pid 1 need not reap orphans), and its temporary file is stale all the same."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:          # no /proc (not Linux), or the process just went
        return False
    return stat[stat.rindex(b")") + 2:][:1] in (b"Z", b"X")


class AtomicOutput:
    """One output file written under a temporary name and renamed into place by commit().

    As a context manager it opens the file and commits on success; on an error it removes the temporary
    file (an OSError becomes a GGUFError naming the path)."""

    def __init__(self, path, *, inputs=(), force=False, hint=""):
        self.path = check_output(path, inputs, force=force, hint=hint)
        self.tmp = temp_path(self.path)
        self.force = force
        self.fh = None

    def open(self):
        if self.fh is None:
            remove_stale_temps(self.path)
            _pending.add(self.tmp)
            try:
                self.fh = open(self.tmp, "wb")
            except OSError as e:
                _pending.discard(self.tmp)
                raise os_error(self.path, e) from None
        return self.fh

    def commit(self):
        """fsync and move into place: replacing an existing file only with force."""
        try:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()
            self.fh = None
            if self.force:
                os.replace(self.tmp, self.path)
            else:
                _place_new(self.tmp, self.path)
        except FileExistsError:
            self.abort()
            raise GGUFError(self.path, "output appeared while this command was writing it (another process wrote "
                                       "it); it was left as it is: pass --force to overwrite it") from None
        except OSError as e:
            self.abort()
            raise os_error(self.path, e) from None
        except BaseException:       # a stop signal between the link and the unlink: the name stays, tmp goes
            self.abort()
            raise
        _pending.discard(self.tmp)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def abort(self):
        if self.fh is not None:
            try:
                self.fh.close()
            except OSError:
                pass        # a full disk fails the final flush too; the file goes anyway
            self.fh = None
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass
        _pending.discard(self.tmp)

    def __enter__(self):
        return self.open()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.commit()
            return
        self.abort()
        if isinstance(exc, OSError):
            raise os_error(self.path, exc) from None


NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


def _place_new(tmp, path):
    """Give tmp the name path unless a file has that name (FileExistsError): link(2) fails atomically on an
    existing name, unlike rename(2). Where the file system has no hard links, the check and the rename are two
    steps."""
    try:
        os.link(tmp, path)
    except OSError as e:
        if e.errno not in NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


def write_bytes(path, data: bytes, *, inputs=(), force=False):
    """A small output (a manifest) written atomically."""
    with AtomicOutput(path, inputs=inputs, force=force) as fh:
        fh.write(data)


def write_with(path, write, *, inputs=(), force=False):
    """An output written by a library that takes a path (matplotlib): write(tmp_path) fills the temporary file,
    which then replaces path."""
    out = AtomicOutput(path, inputs=inputs, force=force)
    with out:
        write(out.tmp)


def copy_file(src, dst, *, inputs=(), force=False):
    """A byte copy of a whole file (kernel copy where the system offers it), atomic."""
    out = AtomicOutput(dst, inputs=inputs, force=force)
    with open(src, "rb") as s, out as fh:
        n = os.fstat(s.fileno()).st_size
        if copy_range(s.fileno(), fh.fileno(), 0, 0, n) != n:
            raise GGUFError(src, "file shrank while it was copied")


def copy_range(src_fd, dst_fd, src_offset, dst_offset, n) -> int:
    """Copy n bytes between file offsets: copy_file_range (reflink where the file system offers it), with a
    pread/pwrite fallback. Returns the bytes copied: fewer than n when the source ends early."""
    done = 0
    try:
        while done < n:
            step = os.copy_file_range(src_fd, dst_fd, min(n - done, 1 << 30), src_offset + done, dst_offset + done)
            if step == 0:
                break
            done += step
    except (OSError, AttributeError):
        pass        # no kernel copy here (or across these file systems); a real write error recurs below
    while done < n:
        chunk = os.pread(src_fd, min(COPY_CHUNK, n - done), src_offset + done)
        if not chunk:
            break
        os.pwrite(dst_fd, chunk, dst_offset + done)
        done += len(chunk)
    return done


def fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
