"""`llmctl plan --plot FILE`: written where asked, never over a file llmctl did not write, and a
place it cannot write is one line before any planning. Through the console entry point."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

Main = Callable[[list[str]], tuple[int, str, str]]
PLAN = ["plan", "recipe=tiny_cpu"]


def test_plot_is_written_at_the_named_path_and_replaced_only_if_ours(
    tmp_path: Path, run_main: Main
) -> None:
    pytest.importorskip("matplotlib")
    for name, magic in (("p.png", b"\x89PNG"), ("p.svg", b"<?xml"), ("p.pdf", b"%PDF")):
        out = tmp_path / name
        for _ in range(2):  # the second run replaces its own figure
            code, _, err = run_main([*PLAN, "--plot", str(out)])
            assert code == 0, err
            assert out.read_bytes().startswith(magic)
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG my own figure")
    code, stdout, err = run_main([*PLAN, "--plot", str(mine)])
    assert (code, stdout) == (2, "")
    assert err == (
        f"error: {mine} exists and was not written by `llmctl plan --plot`; not replacing it "
        "(choose another --plot)\n"
    )
    assert mine.read_bytes() == b"\x89PNG my own figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.png", "p.pdf", "p.png", "p.svg"]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("folder", "--plot {p}: expected a file name ending in .png, .svg or .pdf"),
        ("notes.txt", "--plot {p}: expected a file name ending in .png, .svg or .pdf"),
        ("notes.txt/x.png", "cannot write {p}: {t}/notes.txt is a file, not a folder"),
    ],
)
def test_a_plot_path_it_cannot_use_is_one_line(
    tmp_path: Path, run_main: Main, where: str, message: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("mine\n")
    path = tmp_path / where
    code, stdout, err = run_main([*PLAN, "--plot", str(path)])
    assert (code, stdout) == (2, "")  # before the plan is printed
    assert err == f"error: {message.format(p=path, t=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
