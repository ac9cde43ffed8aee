"""lm-evaluation-harness tasks that run offline: llmctl's shipped task and the user's own.

Why tasks are written into a folder at run time: a harness task is a YAML file whose
`dataset_kwargs.data_files` names its JSONL, and the datasets library resolves a relative name
against the working directory, not the YAML. So llmctl writes each shipped task's YAML into a
fresh folder with the absolute path of its JSONL (a package resource, so it works from a
wheel) and points the harness there (`include_path`). Nothing is fetched from a hub: the YAMLs
use `dataset_path: json`, and `HF_HUB_OFFLINE`/`HF_DATASETS_OFFLINE` are set around the run.

Shipped: `llmctl_arith`, 100 multiple-choice additions ("Question: 46 + 43 =\\nAnswer:" with
four numbers, one right; generated once with a fixed seed and stored in
`task_files/llmctl_arith.jsonl`), scored by log-likelihood (`acc`, `acc_norm`). A user's own
tasks: `--tasks-dir DIR` of harness YAMLs, named by their `task:` key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmctl.errors import UserError

TASK_FILES = Path(__file__).resolve().parent / "task_files"


@dataclass(frozen=True, slots=True)
class ShippedTask:
    """A multiple-choice task of llmctl: its JSONL (question, choices, answer index)."""

    name: str
    jsonl: str
    doc_to_text: str
    about: str


SHIPPED: dict[str, ShippedTask] = {
    "llmctl_arith": ShippedTask(
        name="llmctl_arith",
        jsonl="llmctl_arith.jsonl",
        doc_to_text="Question: {{question}}\\nAnswer:",
        about="100 two-number additions, four choices each (acc, acc_norm)",
    ),
}
DEFAULT_TASKS: tuple[str, ...] = ("llmctl_arith",)


#: First line of every task YAML llmctl writes: what `--write-tasks` may replace.
YAML_HEADER = "# written by llmctl eval (a shipped task); llmctl rewrites this file"


def task_yaml(task: ShippedTask, cache_dir: Path) -> str:
    """The harness YAML of a shipped task, naming its JSONL by absolute path."""
    data = (TASK_FILES / task.jsonl).resolve()
    return (
        f"{YAML_HEADER}\n"
        f"task: {task.name}\n"
        "dataset_path: json\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {data}\n"
        f"  cache_dir: {cache_dir.resolve()}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        f'doc_to_text: "{task.doc_to_text}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\n'
        "metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n"
    )


def write_shipped_tasks(dest: Path) -> Path:
    """Write every shipped task's YAML into `dest` (created); returns `dest`, the folder to
    give the harness as `include_path` (also what `python -m lm_eval --include_path` reads)."""
    for task in SHIPPED.values():  # a file of the same name that llmctl did not write stays
        target = dest / f"{task.name}.yaml"
        if target.is_dir() or (target.exists() and not _ours(target)):
            raise UserError(
                f"--write-tasks {dest}: {target.name} is there and llmctl did not write it; "
                "choose another folder"
            )
    dest.mkdir(parents=True, exist_ok=True)
    for task in SHIPPED.values():
        (dest / f"{task.name}.yaml").write_text(task_yaml(task, dest / "datasets_cache"))
    return dest


def _ours(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return f.readline().rstrip("\n") == YAML_HEADER
    except OSError:
        return False


def _tag_tolerant_loader() -> type:
    """A safe YAML loader that reads harness tags (`!function utils.process_docs`) as None."""
    import yaml

    class Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types here
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return Loader


def user_task_names(tasks_dir: Path) -> dict[str, Path]:
    """`task:` name -> YAML file, for every YAML under a user's tasks folder.

    Raises:
        UserError: The folder is missing or holds no harness task.
    """
    import yaml

    loader = _tag_tolerant_loader()
    if not tasks_dir.is_dir():
        raise UserError(f"--tasks-dir {tasks_dir} is not a folder")
    found: dict[str, Path] = {}
    for path in sorted([*tasks_dir.rglob("*.yaml"), *tasks_dir.rglob("*.yml")]):
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
        except (yaml.YAMLError, UnicodeDecodeError):
            continue  # not a YAML document: the harness would not read it either
        name = data.get("task") if isinstance(data, dict) else None
        if isinstance(name, str):
            found[name] = path
    if not found:
        raise UserError(f"--tasks-dir {tasks_dir} holds no YAML with a `task:` name")
    return found


def check_tasks(names: tuple[str, ...], tasks_dir: Path | None) -> tuple[str, ...]:
    """The tasks to run, each shipped or in `tasks_dir`.

    Raises:
        UserError: An unknown task name, listing the known ones.
    """
    known = set(SHIPPED) | (set(user_task_names(tasks_dir)) if tasks_dir else set())
    for name in names:
        if name not in known:
            where = "" if tasks_dir else "; pass --tasks-dir DIR for your own harness YAMLs"
            raise UserError(f"unknown task {name!r}; known: {', '.join(sorted(known))}{where}")
    if len(set(names)) != len(names):
        raise UserError(f"--task names a task twice: {', '.join(names)}")
    return names
