"""gguf-py's constants without the rest of gguf-py, for the command line's start-up.

ggtools takes only gguf-py's enums and block sizes (gguf/constants.py, which imports nothing heavy), but `import
gguf` runs the package's __init__, which loads its reader, writer, quantizers, vocabulary (sentencepiece) and
metadata (yaml) modules too: tens of milliseconds before `ggtools inspect` can print a line. `install()` puts in
its place the package module object with gguf/constants.py executed into it; the first use of any other name
(`gguf.GGUFReader`, `from gguf import GGUFWriter`) runs the real __init__ in that same module object, so every
name resolves to the one object it would have been, early or late.
"""

import importlib.util
import sys
import threading


def install():
    """Make `gguf` the constants-first module (no-op when gguf is imported already or cannot be found)."""
    if "gguf" in sys.modules:
        return
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        return
    package = importlib.util.module_from_spec(spec)
    constants = importlib.util.spec_from_file_location(
        "gguf.constants", f"{spec.submodule_search_locations[0]}/constants.py")
    module = importlib.util.module_from_spec(constants)
    sys.modules["gguf"], sys.modules["gguf.constants"] = package, module
    try:
        constants.loader.exec_module(module)
    except BaseException:
        del sys.modules["gguf"], sys.modules["gguf.constants"]
        raise
    package.constants = module
    package.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("_")})

    lock = threading.Lock()

    def finish(name):
        """The rest of the package, on the first name constants.py does not define."""
        with lock:
            if "__getattr__" in vars(package):
                del package.__getattr__
                spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = finish
