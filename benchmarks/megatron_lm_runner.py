"""Run Megatron-LM's own tools/preprocess_data.py from a checkout, as is:
`python megatron_lm_runner.py CHECKOUT ARGS...` (ARGS are the script's).

Used by the preprocess benchmark and by tests/unit/data/test_megatron_lm_script.py. It only
stands in a package object for `megatron.training` so that its `__init__` (training loop, GPU
kernels the tool never uses) is not imported, and a stub `six` when that package is absent
(BERT tokenizer import only).
"""

import importlib
import runpy
import sys
import types
from pathlib import Path


def main() -> None:
    mlm = Path(sys.argv[1])
    sys.argv = [str(mlm / "tools" / "preprocess_data.py"), *sys.argv[2:]]
    sys.path.insert(0, str(mlm))
    try:
        import six
    except ImportError:
        six = types.ModuleType("six")
        six.PY2, six.PY3, six.text_type, six.binary_type = False, True, str, bytes  # type: ignore[attr-defined]
        six.string_types = (str,)  # type: ignore[attr-defined]
        sys.modules["six"] = six
    pkg = types.ModuleType("megatron.training")
    pkg.__path__ = [str(mlm / "megatron" / "training")]
    sys.modules["megatron.training"] = pkg
    gv = importlib.import_module("megatron.training.global_vars")
    for name in dir(gv):
        if name.startswith("get_"):
            setattr(pkg, name, getattr(gv, name))
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
