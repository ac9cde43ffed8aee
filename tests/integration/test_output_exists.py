"""One line for "the output is already there", whichever command writes it.

Each command that writes an output (`data preprocess|dedup|sft`, `import hf`, `export hf`,
`quantize`) runs through the console entry point against a target holding a file the user put
there, without `--force`: exit code 2, the same single line on stderr (naming the path), nothing
on stdout, and the user's file byte for byte as it was, with no staging folder left beside it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hf_support import TEXT, make_model

USER_BYTES = b"the user's own file\n"
LINE = "error: {} exists; pass --force to replace llmctl's own outputs, or choose another --out"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exists")
    docs = root / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT))
    pairs = root / "pairs.jsonl"
    rows = [{"prompt": t[:10], "completion": t[10:]} for t in TEXT[:5]]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"docs": docs, "pairs": pairs, "hf": make_model("llama", root / "hf")}


def _commands(i: dict[str, Path], out: Path) -> dict[str, tuple[list[str], Path]]:
    """command -> (argv, the path the error must name: a folder, or PREFIX.bin)."""
    hf, docs, o = str(i["hf"]), str(i["docs"]), str(out)
    return {
        "preprocess": (["data", "preprocess", docs, "-t", hf, "-o", o], Path(f"{out}.bin")),
        "dedup": (["data", "dedup", docs, "-o", o, "-j", "1"], out),
        "sft": (
            ["data", "sft", str(i["pairs"]), "-t", hf, "-o", o, "--seq-length", "32"],
            Path(f"{out}.bin"),
        ),
        "import": (["import", "hf", hf, "--out", o], out),
        "export": (["export", "hf", str(out.parent / "no_run"), "--out", o], out),
        "quantize": (["quantize", hf, "--out", o, "--scheme", "w8a16", "--algorithm", "rtn"], out),
    }


@pytest.mark.parametrize("command", ["preprocess", "dedup", "sft", "import", "export", "quantize"])
def test_existing_output_is_one_shared_line(
    command: str,
    inputs: dict[str, Path],
    tmp_path: Path,
    run_main: Callable[[list[str]], tuple[int, str, str]],
) -> None:
    out = tmp_path / "out"
    argv, named = _commands(inputs, out)[command]
    user_file = named if named != out else out / "notes.txt"
    user_file.parent.mkdir(parents=True, exist_ok=True)
    user_file.write_bytes(USER_BYTES)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, stderr = run_main(argv)
    assert code == 2, stderr
    assert stdout == ""
    assert [ln for ln in stderr.splitlines() if ln.strip()] == [LINE.format(named)]
    assert user_file.read_bytes() == USER_BYTES
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging, log or lock left


@pytest.mark.parametrize("command", ["preprocess", "dedup", "sft", "import", "export", "quantize"])
def test_output_under_a_file_is_one_line(
    command: str,
    inputs: dict[str, Path],
    tmp_path: Path,
    run_main: Callable[[list[str]], tuple[int, str, str]],
) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_bytes(USER_BYTES)
    out = blocker / "out"
    argv, _ = _commands(inputs, out)[command]
    code, stdout, stderr = run_main(argv)
    assert (code, stdout) == (2, ""), stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {out}"), stderr
    assert lines[0].endswith(f"{blocker} is a file, not a folder")
    assert blocker.read_bytes() == USER_BYTES and [p.name for p in tmp_path.iterdir()] == [
        "notes.txt"
    ]


def test_failed_export_leaves_no_empty_log(
    tmp_path: Path, run_main: Callable[[list[str]], tuple[int, str, str]]
) -> None:
    code, stdout, stderr = run_main(
        ["export", "hf", str(tmp_path / "no_run"), "-o", str(tmp_path / "hf")]
    )
    assert (code, stdout) == (2, "") and "is not a run directory" in stderr
    assert list(tmp_path.iterdir()) == []
