"""The runnable blocks of the method guides (docs/xlm_align.md, align_mlm.md, code_switch.md, mlm_gc.md) that train.

The marks, the parsing and the topic guides' pages are tests/test_docs_examples.py; this file holds the
method guides' slow pages only so that xdist (--dist loadfile) can run them beside the others on a second worker.
"""

import pytest

from tests.test_docs_examples import run_slow_page, slow_pages


@pytest.mark.slow
@pytest.mark.parametrize("rel", slow_pages(methods=True))
def test_method_guide_blocks_that_train(rel, tmp_path, bible_data_dir):
  run_slow_page(rel, tmp_path, bible_data_dir)
