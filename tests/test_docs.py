"""The docs cannot drift: every Python block of README.md and docs/*.md runs here, or says why not.

How a block is found, what may sit beside it and how it is run: docs_blocks.py
(and docs/testing.md, "Docs that run").
"""

from pathlib import Path

import pytest

from docs_blocks import CENSUS, ROOT, Block, blocks, defines_durable_objects, every_block, run_block

BLOCKS = every_block()


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_block_runs_or_says_why_not(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.not_run is not None:
        CENSUS["not run"].append(block.where)
        pytest.skip(f"{block.where}: not run: {block.not_run}")
    monkeypatch.chdir(ROOT)  # blocks name files as a reader in the repository's root would
    try:
        module = run_block(block)
    except Exception as error:
        pytest.fail(f"{block.where}: this python block does not run ({type(error).__name__}: {error}). "
                    "Make it run (a <!-- setup --> or <!-- check --> comment beside it may help), or mark it "
                    "with <!-- not run: REASON --> on the line before its fence.")
    if defines_durable_objects(module) and not block.check:
        pytest.fail(f"{block.where}: this block defines Durable Objects and no <!-- check --> after it drives them")
    CENSUS["run"].append(block.where)


def test_the_convention_catches_a_block_that_does_not_run(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("intro\n\n```python\nundefined_name()\n```\n\n<!-- not run: a fragment -->\n"
                    "```python\nawait x\n```\n\n<!-- setup\nvalue = 2\n-->\n```python\nresult = value * 3\n```\n"
                    "<!-- check\nassert result == 6 and worker.result == 6\n-->\n")
    broken, marked, checked = blocks(page)
    assert (broken.line, broken.not_run, marked.not_run) == (3, None, "a fragment")
    assert (checked.setup, checked.setup_line, checked.check_line) == ("value = 2", 13, 19)
    with pytest.raises(NameError) as error:
        run_block(broken)
    assert str(page) in "".join(str(entry.path) for entry in error.traceback)
    assert run_block(checked).result == 6


