"""A Worker module for the embedded runtime, imported afresh from its file.

Lives here: ``load_worker_module``: the CPython stand-in for ``workers``
installed first, the module's folder put on ``sys.path`` (for its own
imports), and the file imported under its own name, in place of any module
of that name. Must not know: ``wrangler.toml`` or the runtime;
``Runtime.from_wrangler`` reads the file and names the module.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ._workers_standin import install_workers_standin


def load_worker_module(path: Path) -> ModuleType:
    """Import a Worker module afresh, with the CPython stand-in for ``workers``."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"Worker module {path} not found")
    install_workers_standin()
    source_dir = str(path.parent)
    if source_dir not in sys.path:
        sys.path.insert(0, source_dir)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
