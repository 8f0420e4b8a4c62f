"""Fit options of earlier reports and of the paper's recipe: presets that only the
benchmarks use, kept beside them (a user's fit starts from
:meth:`DiffMask.fit <captum_diffmask.DiffMask.fit>`'s defaults)."""

from typing import Any, Dict

#: :meth:`DiffMask.fit` options that restore the optimisation of the reports made
#: before fit ran to convergence (with ``lr=1e-3, epochs=10`` where a report left
#: those at their defaults then).
LEGACY_FIT: Dict[str, Any] = {
    "optimizer": "rmsprop", "multiplier": "ascent", "until_converged": False, "constraint": "sampled",
    "vote_sampling": "product",
}

#: :meth:`DiffMask.fit` options that restore the optimisation of the reports made
#: with fit's earlier defaults, up to commit 59c9a48 (the damped multiplier on the
#: sampled gates' KL, the votes' product sampled; with ``epochs=100`` where a
#: report left the cap at its default then). The convergence criterion is today's.
DAMPED_FIT: Dict[str, Any] = {
    "multiplier": "damped", "lr_lambda": 1.0, "constraint": "sampled", "vote_sampling": "product",
    "freeze_converged": False,
}

#: The ``DiffMask`` constructor's sparsity term of the reports made while it was
#: the default: the paper's expected L0, the sum of ``P(z != 0)`` over positions
#: (the default is now the share of positions kept, ``l0="mean"``). The toy
#: family's suites, the components', sst-erasure's amortised DiffMask and the
#: studies built on them keep it (here, or as ``"l0": "expected"`` where a
#: suite's config reaches the constructor), so that their reports stay the runs
#: they hold.
PAPER_L0: Dict[str, Any] = {"l0": "expected"}
#: What those suites' choice of :data:`PAPER_L0` was made on (their ``CHOSEN_ON``).
PAPER_L0_CHOSEN_ON: Dict[str, str] = {
    "on": "rule", "why": "the paper's expected L0 (the sum of P(z != 0) over positions or components), DiffMask's "
                         "default when the suite's reports were made"}

#: :meth:`DiffMask.fit` options that restore fit's default of the reports made
#: while the deployed read-out's KL was measured at every step: the sst,
#: faithfulness and squad suites keep it, so that their committed reports (hours
#: of fitting on 2 cores) stay the runs they hold until rerun at today's defaults.
EVERY_STEP_DEPLOYED_FIT: Dict[str, Any] = {"deployed_every": 1}
#: What those suites' choice of :data:`EVERY_STEP_DEPLOYED_FIT` was made on.
EVERY_STEP_DEPLOYED_CHOSEN_ON: Dict[str, str] = {
    "on": "rule", "why": "fit's default when the suite's report was made (the deployed read-out's KL measured every "
                         "step); today's, every second step (docs/reproduction/fit-defaults.md), not yet rerun on "
                         "this suite"}

#: :meth:`DiffMask.fit` options of the paper's recipe (its appendix tables for SST
#: and SQuAD: Lookahead RMSprop at lr 3e-4 for the gates and 0.1 for the
#: multipliers; from the authors' code: the baselines at 1e-3, one layer drawn per
#: batch, the sampled gates' KL, the product of the votes' samples, no stop at
#: convergence). The task's part is the caller's: eps (SST 0.5, SQuAD 1), the
#: batch (64, 8) and the epochs (100 on SST). Their lr warm-up (constant after
#: 1 200 steps) is not reproduced. Their input-mode probe is
#: ``DiffMask(votes="tied")`` (a constructor option, not the fit's).
PAPER_FIT: Dict[str, Any] = {
    "optimizer": "lookahead-rmsprop", "lr": 3e-4, "lr_baseline": 1e-3, "multiplier": "rmsprop", "lr_lambda": 0.1,
    "constraint": "sampled", "vote_sampling": "product", "layers_per_batch": "one", "until_converged": False,
}
