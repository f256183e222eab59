"""The docs cannot drift from the code: every message docs/troubleshooting.md quotes still exists in the source."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_quoted_error_message_still_exists_in_the_code():
    doc = (ROOT / "docs" / "troubleshooting.md").read_text()
    quoted = re.findall(r"^### `(.+)`$", doc, flags=re.MULTILINE)
    assert len(quoted) >= 20
    source = "\n".join(p.read_text() for p in (ROOT / "asyncrl").rglob("*.py"))
    missing = [q for q in quoted if q not in source]
    assert not missing, f"docs/troubleshooting.md quotes messages the code no longer has: {missing}"


# ---- the verl key map (docs/from-verl.md) is generated from the config tree ---------------------------------------
def test_every_config_key_has_a_verl_entry_and_no_entry_is_stale():
    from asyncrl_lab import verl_keymap

    assert not verl_keymap.unmapped(), f"config keys missing from verl_keymap.VERL_NAMES: {verl_keymap.unmapped()}"
    assert not verl_keymap.stale(), f"verl_keymap.VERL_NAMES names keys the config no longer has: {verl_keymap.stale()}"


def test_from_verl_embeds_the_generated_key_map():
    from asyncrl_lab import verl_keymap

    page = (ROOT / "docs" / "from-verl.md").read_text()
    assert verl_keymap.embedded(page) == verl_keymap.render(), "docs/from-verl.md's key map is stale: make verl-keymap"


def test_the_translated_verl_command_loads():
    """The page's whole command (and its one_step_off variant with 8 trainer ranks) passes the config loader."""
    import shlex

    from asyncrl.config import load_config

    page = (ROOT / "docs" / "from-verl.md").read_text()
    block = re.search(r"The whole command:\n\n```bash\n(.*?)```", page, flags=re.DOTALL).group(1)
    args = shlex.split(block.replace("\\\n", " ").replace("$HOME", "/home/user").replace('"$@"', ""))
    assert args[:3] == ["asyncrl", "train", "--config"]
    cfg = load_config(ROOT / args[3], args[4:])
    assert (cfg.rollout.engine, cfg.rollout.n, cfg.data.train_batch_size) == ("vllm", 5, 1024)
    variant = load_config(
        ROOT / args[3],
        [*args[4:], "trainer.schedule=one_step_off", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=8"],
    )
    assert (variant.trainer.num_workers, variant.rollout.num_workers) == (8, 1)


def test_verls_7b_fully_async_recipe_is_translated_key_by_key_and_fits_its_gpus():
    """Every line of verl's dapo_7b_math_fsdp2_8_8.sh that sets something has a row; every asyncrl key the rows name
    exists; the translated command loads and its memory plan fits 8 + 8 GPUs of 80 GB (Qwen2.5-7B's config)."""
    import shlex

    from asyncrl.config import load_config
    from asyncrl.sizing.check import check_memory
    from asyncrl_lab import verl_keymap

    page = (ROOT / "docs" / "from-verl.md").read_text()
    section = page.split("## verl's fully_async DAPO recipe for a 7B model", 1)[1]
    table = section.split("| verl | asyncrl |\n| --- | --- |\n", 1)[1].split("\n\n", 1)[0]
    rows = [r.split(" | ", 1) for r in table.splitlines()]
    assert len(rows) == 83  # the entry point, VLLM_USE_V1 and the 81 overrides
    assert len({verl for verl, _ in rows}) == 83
    leaves = {k for k, _ in verl_keymap.config_keys()}
    named = [k for _, ours in rows for k in re.findall(r"`([a-z_]+(?:\.[a-z_0-9]+)+)=", ours)]
    unknown = [k for k in named if k not in leaves and not k.startswith("model.override_config.")]
    assert named and not unknown, unknown
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    args = shlex.split(block.replace("\\\n", " ").replace("$HOME", "/home/user").replace('"$@"', ""))
    assert args[:2] == ["asyncrl", "train"]
    model = ROOT / "tests" / "fixtures" / "models" / "qwen2.5-7b"
    cfg = load_config(None, [*args[2:], f"model.path={model}"])
    assert (cfg.trainer.num_workers, cfg.rollout.num_workers, cfg.trainer.strategy) == (8, 8, "fsdp2")
    plan = check_memory(cfg, device_bytes=int(80e9))  # raises, naming the role, if a GPU cannot hold it
    assert plan is not None and plan.fits() and plan.trainer.total <= 70e9


# ---- the front page and the guides --------------------------------------------------------------------------------
def test_readme_is_a_front_page_under_150_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_is_at_most_8000_characters():
    size = len((ROOT / "README.md").read_text())
    assert size <= 8000, f"README.md has {size} characters; move detail to docs/ or BENCHMARKS.md"


def test_readme_links_every_page_in_docs():
    readme = (ROOT / "README.md").read_text()
    pages = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").rglob("*.md"))]
    missing = [p for p in pages if f"]({p})" not in readme and f"]({p}#" not in readme]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_every_algorithm_and_schedule_has_a_guide_linked_from_the_readme():
    from asyncrl.algorithms import builtin_algorithms
    from asyncrl.config.schema import SCHEDULES

    readme = (ROOT / "README.md").read_text()
    pages = [f"docs/algorithms/{a}.md" for a in builtin_algorithms()] + [f"docs/schedules/{s}.md" for s in SCHEDULES]
    missing = [p for p in pages if not (ROOT / p).is_file() or f"]({p})" not in readme]
    assert not missing, f"guides missing or not linked from README.md: {missing}"


def test_every_relative_link_in_the_docs_resolves():
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#", 1)[0]
            if path and "://" not in path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


# ---- the record: BENCHMARKS.md holds results, and every figure the README quotes is in it ------------------------
# A figure with its unit: a ratio (0.90x), a share (51.2%) or a quantity (566 samples/s, 200 ms, 19.5 MB, 501 s).
FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:x|%| (?:ms|s|MB|GB|MiB|GiB|samples/s|tokens/s|points))(?![\w/])")


def _headings(markdown: str) -> list[str]:
    """The lines that are headings, leaving out lines of fenced code (a shell comment starts with # too)."""
    headings, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            headings.append(line)
    return headings


def test_benchmarks_is_a_record_of_results_not_a_diary():
    text = (ROOT / "BENCHMARKS.md").read_text()
    lines = text.splitlines()
    assert len(lines) < 800, f"BENCHMARKS.md has {len(lines)} lines: keep each question's current table only"
    diary = [line for line in lines if "session" in line.lower()]
    assert not diary, f"BENCHMARKS.md narrates sessions: {diary}"
    timed = [h for h in _headings(text) if re.search(r"(?<!\d)\d{1,2}:\d{2}(?!\d)", h)]
    assert not timed, f"BENCHMARKS.md headings with a time of day: {timed}"


def test_the_headings_check_skips_fenced_code_and_sees_times_of_day():
    page = "# Benchmarks\n```bash\n# run at 10:00\n```\n### Decode (09:31-09:42 UTC)\n"
    assert _headings(page) == ["# Benchmarks", "### Decode (09:31-09:42 UTC)"]


def test_every_figure_the_readme_quotes_is_in_benchmarks():
    readme = (ROOT / "README.md").read_text()
    record = (ROOT / "BENCHMARKS.md").read_text()
    figures = sorted(set(FIGURE.findall(readme)))
    assert len(figures) >= 10, f"README.md quotes too few figures for this check to mean anything: {figures}"
    missing = [f for f in figures if not re.search(rf"(?<![\w.]){re.escape(f)}(?![\w/])", record)]
    assert not missing, f"README.md quotes figures that BENCHMARKS.md does not record: {missing}"


def test_the_figure_pattern_takes_numbers_with_units_only():
    text = "1.92-2.10x, +9.5%, 566 samples/s in 20 steps, 8 x 8, 2 cores, 200 ms, 19.5 MB, 501 s. 4x4 v0.32"
    assert FIGURE.findall(text) == ["2.10x", "9.5%", "566 samples/s", "200 ms", "19.5 MB", "501 s"]
